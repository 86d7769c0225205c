# One Firstlight region on AWS: an EKS cluster with a system and a GPU node group, the
# Cluster Autoscaler for them (autoscaling.tf), an ElastiCache Redis for prefix-cache
# hints (redis.tf), a TLS certificate for the region's names (tls.tf), the AWS Load
# Balancer Controller (load_balancer.tf), and the ingress controller, NVIDIA device
# plugin, KubeRay operator and Firstlight chart (platform.tf) with values from values.tf.
#
# Providers come from the caller (aws, and kubernetes/helm configured from this module's
# cluster outputs), so several regions can live in one configuration with aliases.

data "aws_region" "current" {}

module "eks" {
  #checkov:skip=CKV_TF_1:A registry module, pinned by version constraint as the Terraform Registry intends; a git commit source would bypass the registry's release resolution.
  source  = "terraform-aws-modules/eks/aws"
  version = "~> 21.0"

  name               = local.cluster_name
  kubernetes_version = var.kubernetes_version

  # No public endpoint unless the caller names who may reach it (no default: see
  # variables.tf); the private endpoint stays on either way.
  endpoint_public_access                   = length(var.endpoint_public_access_cidrs) > 0
  endpoint_public_access_cidrs             = var.endpoint_public_access_cidrs
  enable_cluster_creator_admin_permissions = true

  addons = {
    coredns                = {}
    eks-pod-identity-agent = { before_compute = true }
    kube-proxy             = {}
    vpc-cni = {
      before_compute = true
      # Enforce NetworkPolicies (the chart's keep Ray's ports and Redis to the release's
      # own pods); without this the VPC CNI ignores them.
      configuration_values = jsonencode({ enableNetworkPolicy = "true" })
    }
  }

  vpc_id     = var.vpc_id
  subnet_ids = var.private_subnet_ids

  eks_managed_node_groups = {
    system = {
      ami_type       = "AL2023_x86_64_STANDARD"
      instance_types = var.system_node_group.instance_types
      min_size       = var.system_node_group.min_size
      max_size       = var.system_node_group.max_size
      desired_size   = var.system_node_group.desired_size
      labels         = { "firstlight/pool" = "system" }
    }
    gpu = {
      ami_type       = var.gpu_node_group.ami_type
      instance_types = var.gpu_node_group.instance_types
      min_size       = var.gpu_node_group.min_size
      max_size       = var.gpu_node_group.max_size
      desired_size   = var.gpu_node_group.desired_size
      disk_size      = var.gpu_node_group.disk_size_gib
      labels         = merge(local.gpu_node_labels, local.gpu_accelerator_label)
      # Only pods that tolerate it (the Ray workers, the device plugin) land on GPUs.
      taints = {
        gpu = { key = local.gpu_node_taint.key, value = local.gpu_node_taint.value, effect = "NO_SCHEDULE" }
      }
    }
  }

  tags = local.tags
}
