# A fleet over two clouds: us-east on AWS (us-east-1, region-aws) and eu-central on
# Google Cloud (europe-west3, Frankfurt, region-gke), each the other's peer, behind
# latency-based DNS in Route 53. Both region modules take the same Firstlight inputs
# and give latency-dns-aws the same dns_target; the GKE region is keyed for latency by
# eu-central-1, the AWS region in the same city.

locals {
  rtt_ms = 90 # us-east-1 <-> europe-west3 round trip prior (ms); the gateways' probes refine it
  tags   = { "app.kubernetes.io/part-of" = "firstlight" }

  # The same Firstlight settings in both regions (hash seed, image, API endpoint rule).
  common = {
    domain                       = var.domain
    zone_id                      = data.aws_route53_zone.domain.zone_id
    hash_seed                    = var.hash_seed
    image                        = var.image
    helm_repositories            = var.helm_repositories
    endpoint_public_access_cidrs = var.endpoint_public_access_cidrs
  }
}

provider "aws" {
  region = "us-east-1"
}

provider "google" {
  project = var.gcp_project_id
  region  = "europe-west3"
}

data "aws_route53_zone" "domain" {
  name = var.domain
}

# --- us-east on AWS ----------------------------------------------------------------------

module "vpc_us_east" {
  source = "../three-regions/vpc"

  name = "firstlight-us-east"
  azs  = ["us-east-1a", "us-east-1b", "us-east-1c"]
  cidr = "10.10.0.0/16"
  tags = local.tags
}

module "us_east" {
  source    = "../../modules/region-aws"
  providers = { kubernetes = kubernetes.us_east, helm = helm.us_east }

  region_name                  = "us-east"
  peers                        = [{ region = "eu-central", rtt_ms = local.rtt_ms }]
  vpc_id                       = module.vpc_us_east.vpc_id
  private_subnet_ids           = module.vpc_us_east.private_subnet_ids
  domain                       = local.common.domain
  zone_id                      = local.common.zone_id
  hash_seed                    = local.common.hash_seed
  image                        = local.common.image
  helm_repositories            = local.common.helm_repositories
  endpoint_public_access_cidrs = local.common.endpoint_public_access_cidrs
  gpu_node_group = {
    instance_types = ["g6.2xlarge"]
    ami_type       = "AL2023_x86_64_NVIDIA"
    gpus_per_node  = 1
    min_size       = var.gpu_nodes_min
    max_size       = 4
    desired_size   = max(var.gpu_nodes_min, 1)
    disk_size_gib  = 200
  }
  tags = local.tags
}

provider "kubernetes" {
  alias                  = "us_east"
  host                   = module.us_east.cluster_endpoint
  cluster_ca_certificate = base64decode(module.us_east.cluster_certificate_authority_data)
  exec {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", module.us_east.cluster_name, "--region", "us-east-1"]
  }
}

provider "helm" {
  alias = "us_east"
  kubernetes = {
    host                   = module.us_east.cluster_endpoint
    cluster_ca_certificate = base64decode(module.us_east.cluster_certificate_authority_data)
    exec = {
      api_version = "client.authentication.k8s.io/v1beta1"
      command     = "aws"
      args        = ["eks", "get-token", "--cluster-name", module.us_east.cluster_name, "--region", "us-east-1"]
    }
  }
}

# --- eu-central on Google Cloud ---------------------------------------------------------

module "network_eu_central" {
  source = "./network"

  project_id = var.gcp_project_id
  name       = "firstlight-eu-central"
  region     = "europe-west3"
  cidr       = "10.40.0.0/20"
}

module "eu_central" {
  source    = "../../modules/region-gke"
  providers = { kubernetes = kubernetes.eu_central, helm = helm.eu_central }

  region_name                  = "eu-central"
  peers                        = [{ region = "us-east", rtt_ms = local.rtt_ms }]
  project_id                   = var.gcp_project_id
  gcp_region                   = "europe-west3"
  latency_region               = "eu-central-1"
  network                      = module.network_eu_central.network
  subnetwork                   = module.network_eu_central.subnetwork
  pods_range_name              = module.network_eu_central.pods_range_name
  services_range_name          = module.network_eu_central.services_range_name
  domain                       = local.common.domain
  zone_id                      = local.common.zone_id
  hash_seed                    = local.common.hash_seed
  image                        = local.common.image
  helm_repositories            = local.common.helm_repositories
  endpoint_public_access_cidrs = local.common.endpoint_public_access_cidrs
  gpu_node_group = {
    machine_type     = "g2-standard-8"
    accelerator_type = "nvidia-l4"
    gpus_per_node    = 1
    min_size         = var.gpu_nodes_min
    max_size         = 4
    disk_size_gib    = 200
    zones            = ["europe-west3-a", "europe-west3-b"]
  }
  labels = { "app-kubernetes-io-part-of" = "firstlight" }
}

data "google_client_config" "current" {}

provider "kubernetes" {
  alias                  = "eu_central"
  host                   = module.eu_central.cluster_endpoint
  cluster_ca_certificate = base64decode(module.eu_central.cluster_certificate_authority_data)
  token                  = data.google_client_config.current.access_token
}

provider "helm" {
  alias = "eu_central"
  kubernetes = {
    host                   = module.eu_central.cluster_endpoint
    cluster_ca_certificate = base64decode(module.eu_central.cluster_certificate_authority_data)
    token                  = data.google_client_config.current.access_token
  }
}

# --- latency-based DNS over both clouds --------------------------------------------------

module "dns" {
  source = "../../modules/latency-dns-aws"

  zone_id = data.aws_route53_zone.domain.zone_id
  domain  = var.domain
  regions = {
    for region in [module.us_east, module.eu_central] : region.region_name => region.dns_target
  }
}
