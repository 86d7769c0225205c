# Three Firstlight regions — us-east (us-east-1), eu-west (eu-west-1) and ap-southeast
# (ap-southeast-1) — each a peer of the other two, behind latency-based DNS.
#
# Terraform cannot configure a provider per for_each instance, so each region is spelt
# out: an aws provider alias, a VPC, the region module, and kubernetes/helm providers
# configured from that region's cluster.

locals {
  # Round-trip-time priors between regions (ms); the gateways' probes refine them.
  rtt_ms = {
    "us-east"      = { "eu-west" = 75, "ap-southeast" = 215 }
    "eu-west"      = { "us-east" = 75, "ap-southeast" = 160 }
    "ap-southeast" = { "us-east" = 215, "eu-west" = 160 }
  }
  peers = {
    for region, others in local.rtt_ms : region => [
      for peer, rtt in others : { region = peer, rtt_ms = rtt }
    ]
  }
  tags = { "app.kubernetes.io/part-of" = "firstlight" }
}

provider "aws" {
  region = "us-east-1"
}

provider "aws" {
  alias  = "us_east_1"
  region = "us-east-1"
}

provider "aws" {
  alias  = "eu_west_1"
  region = "eu-west-1"
}

provider "aws" {
  alias  = "ap_southeast_1"
  region = "ap-southeast-1"
}

data "aws_route53_zone" "domain" {
  name = var.domain
}

# The API key every region accepts (a forwarded request carries it to the peer) is not
# Terraform's: it lives in a Kubernetes Secret created in each region's namespace with
# kubectl (README), so it never enters the state.

locals {
  common = {
    domain                       = var.domain
    zone_id                      = data.aws_route53_zone.domain.zone_id
    hash_seed                    = var.hash_seed
    image                        = var.image
    helm_repositories            = var.helm_repositories
    endpoint_public_access_cidrs = var.endpoint_public_access_cidrs
    gpu_node_group = {
      instance_types = var.gpu_instance_types
      ami_type       = "AL2023_x86_64_NVIDIA"
      gpus_per_node  = 1
      min_size       = var.gpu_nodes_min
      max_size       = 4
      desired_size   = max(var.gpu_nodes_min, 1)
      disk_size_gib  = 200
    }
  }
}

# --- us-east --------------------------------------------------------------------------

module "vpc_us_east" {
  source    = "./vpc"
  providers = { aws = aws.us_east_1 }

  name = "firstlight-us-east"
  azs  = ["us-east-1a", "us-east-1b", "us-east-1c"]
  cidr = "10.10.0.0/16"
  tags = local.tags
}

module "us_east" {
  source    = "../../modules/region-aws"
  providers = { aws = aws.us_east_1, kubernetes = kubernetes.us_east, helm = helm.us_east }

  region_name                  = "us-east"
  peers                        = local.peers["us-east"]
  vpc_id                       = module.vpc_us_east.vpc_id
  private_subnet_ids           = module.vpc_us_east.private_subnet_ids
  domain                       = local.common.domain
  zone_id                      = local.common.zone_id
  hash_seed                    = local.common.hash_seed
  image                        = local.common.image
  helm_repositories            = local.common.helm_repositories
  endpoint_public_access_cidrs = local.common.endpoint_public_access_cidrs
  gpu_node_group               = local.common.gpu_node_group
  tags                         = local.tags
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

# --- eu-west --------------------------------------------------------------------------

module "vpc_eu_west" {
  source    = "./vpc"
  providers = { aws = aws.eu_west_1 }

  name = "firstlight-eu-west"
  azs  = ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
  cidr = "10.20.0.0/16"
  tags = local.tags
}

module "eu_west" {
  source    = "../../modules/region-aws"
  providers = { aws = aws.eu_west_1, kubernetes = kubernetes.eu_west, helm = helm.eu_west }

  region_name                  = "eu-west"
  peers                        = local.peers["eu-west"]
  vpc_id                       = module.vpc_eu_west.vpc_id
  private_subnet_ids           = module.vpc_eu_west.private_subnet_ids
  domain                       = local.common.domain
  zone_id                      = local.common.zone_id
  hash_seed                    = local.common.hash_seed
  image                        = local.common.image
  helm_repositories            = local.common.helm_repositories
  endpoint_public_access_cidrs = local.common.endpoint_public_access_cidrs
  gpu_node_group               = local.common.gpu_node_group
  tags                         = local.tags
}

provider "kubernetes" {
  alias                  = "eu_west"
  host                   = module.eu_west.cluster_endpoint
  cluster_ca_certificate = base64decode(module.eu_west.cluster_certificate_authority_data)
  exec {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", module.eu_west.cluster_name, "--region", "eu-west-1"]
  }
}

provider "helm" {
  alias = "eu_west"
  kubernetes = {
    host                   = module.eu_west.cluster_endpoint
    cluster_ca_certificate = base64decode(module.eu_west.cluster_certificate_authority_data)
    exec = {
      api_version = "client.authentication.k8s.io/v1beta1"
      command     = "aws"
      args        = ["eks", "get-token", "--cluster-name", module.eu_west.cluster_name, "--region", "eu-west-1"]
    }
  }
}

# --- ap-southeast ---------------------------------------------------------------------

module "vpc_ap_southeast" {
  source    = "./vpc"
  providers = { aws = aws.ap_southeast_1 }

  name = "firstlight-ap-southeast"
  azs  = ["ap-southeast-1a", "ap-southeast-1b", "ap-southeast-1c"]
  cidr = "10.30.0.0/16"
  tags = local.tags
}

module "ap_southeast" {
  source    = "../../modules/region-aws"
  providers = { aws = aws.ap_southeast_1, kubernetes = kubernetes.ap_southeast, helm = helm.ap_southeast }

  region_name                  = "ap-southeast"
  peers                        = local.peers["ap-southeast"]
  vpc_id                       = module.vpc_ap_southeast.vpc_id
  private_subnet_ids           = module.vpc_ap_southeast.private_subnet_ids
  domain                       = local.common.domain
  zone_id                      = local.common.zone_id
  hash_seed                    = local.common.hash_seed
  image                        = local.common.image
  helm_repositories            = local.common.helm_repositories
  endpoint_public_access_cidrs = local.common.endpoint_public_access_cidrs
  gpu_node_group               = local.common.gpu_node_group
  tags                         = local.tags
}

provider "kubernetes" {
  alias                  = "ap_southeast"
  host                   = module.ap_southeast.cluster_endpoint
  cluster_ca_certificate = base64decode(module.ap_southeast.cluster_certificate_authority_data)
  exec {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", module.ap_southeast.cluster_name, "--region", "ap-southeast-1"]
  }
}

provider "helm" {
  alias = "ap_southeast"
  kubernetes = {
    host                   = module.ap_southeast.cluster_endpoint
    cluster_ca_certificate = base64decode(module.ap_southeast.cluster_certificate_authority_data)
    exec = {
      api_version = "client.authentication.k8s.io/v1beta1"
      command     = "aws"
      args        = ["eks", "get-token", "--cluster-name", module.ap_southeast.cluster_name, "--region", "ap-southeast-1"]
    }
  }
}

# --- latency-based DNS over the three ---------------------------------------------------

module "dns" {
  source = "../../modules/latency-dns-aws"

  zone_id = data.aws_route53_zone.domain.zone_id
  domain  = var.domain
  regions = {
    for region in [module.us_east, module.eu_west, module.ap_southeast] : region.region_name => region.dns_target
  }
}
