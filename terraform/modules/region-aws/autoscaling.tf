# GPU nodes on demand. Ray's autoscaler adds GPU worker pods when Serve needs replicas
# (the chart's worker group, bounded by the GPU node group's min_size and max_size); the
# Cluster Autoscaler adds a GPU node for each pod no node can take, and removes nodes
# left idle, within the same bounds. Without it the pods would stay Pending.
#
# Cluster Autoscaler rather than Karpenter (README, "Node autoscaling"): it scales the
# EKS managed node groups this module already has, so one min_size/max_size bounds both
# the nodes and Ray's worker pods; it needs no CRD objects (Karpenter's NodePool and
# EC2NodeClass would have to exist in the API server at plan time) and a narrower IAM
# policy (Auto Scaling groups of this cluster only, no ec2:RunInstances or
# iam:PassRole).

locals {
  cluster_autoscaler_service_account = "cluster-autoscaler"
  gpu_node_taint                     = { key = "nvidia.com/gpu", value = "true", effect = "NoSchedule" }
  # The Cluster Autoscaler's GPU label on AWS: a node that carries it but does not yet
  # advertise nvidia.com/gpu (the device plugin starting) counts as not ready, so one
  # pending pod does not bring up a second node.
  gpu_accelerator_label = { "k8s.amazonaws.com/accelerator" = var.gpu_node_group.accelerator }

  # EKS tags a managed node group's Auto Scaling group for the autoscaler's discovery
  # (k8s.io/cluster-autoscaler/enabled and .../<cluster>), but not with the nodes'
  # labels, taints and GPUs: at zero nodes the autoscaler learns from these tags that
  # a new node would carry the Ray workers' label, the taint they tolerate and the GPUs
  # they request (scale from zero).
  gpu_node_template_tags = merge(
    { for key, value in merge(local.gpu_node_labels, local.gpu_accelerator_label) : "k8s.io/cluster-autoscaler/node-template/label/${key}" => value },
    { "k8s.io/cluster-autoscaler/node-template/taint/${local.gpu_node_taint.key}" = "${local.gpu_node_taint.value}:${local.gpu_node_taint.effect}" },
    { "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu" = tostring(var.gpu_node_group.gpus_per_node) },
  )
}

resource "aws_autoscaling_group_tag" "gpu_node_template" {
  for_each = local.gpu_node_template_tags

  autoscaling_group_name = module.eks.eks_managed_node_groups["gpu"].node_group_autoscaling_group_names[0]

  tag {
    key                 = each.key
    value               = each.value
    propagate_at_launch = false
  }
}

# The autoscaler's IAM role through EKS Pod Identity (the cluster runs its agent): the
# community module's policy lets it describe Auto Scaling groups and change only those
# tagged for this cluster.
module "cluster_autoscaler_identity" {
  #checkov:skip=CKV_TF_1:A registry module, pinned by version constraint as the Terraform Registry intends; a git commit source would bypass the registry's release resolution.
  source  = "terraform-aws-modules/eks-pod-identity/aws"
  version = "~> 2.6"

  name            = "${local.cluster_name}-cluster-autoscaler"
  use_name_prefix = false

  attach_cluster_autoscaler_policy = true
  cluster_autoscaler_cluster_names = [module.eks.cluster_name]

  associations = {
    this = {
      cluster_name    = module.eks.cluster_name
      namespace       = "kube-system"
      service_account = local.cluster_autoscaler_service_account
    }
  }

  tags = local.tags
}

resource "helm_release" "cluster_autoscaler" {
  name       = "cluster-autoscaler"
  repository = var.helm_repositories.cluster_autoscaler
  chart      = "cluster-autoscaler"
  version    = var.chart_versions.cluster_autoscaler
  namespace  = "kube-system"
  values = [yamlencode({
    cloudProvider = "aws"
    awsRegion     = data.aws_region.current.region
    autoDiscovery = { clusterName = module.eks.cluster_name }
    image         = { tag = var.chart_versions.cluster_autoscaler_image }
    rbac = {
      serviceAccount = { create = true, name = local.cluster_autoscaler_service_account }
    }
    nodeSelector = { "firstlight/pool" = "system" }
    extraArgs = {
      # Of the groups that fit a pending pod, the one that wastes the least.
      expander = "least-waste"
      # A GPU node without Ray workers for this long is removed (down to min_size).
      "scale-down-unneeded-time" = var.gpu_scale_down_unneeded_time
    }
  })]

  lifecycle {
    precondition {
      condition     = startswith(var.chart_versions.cluster_autoscaler_image, "v${var.kubernetes_version}.")
      error_message = "chart_versions.cluster_autoscaler_image (${var.chart_versions.cluster_autoscaler_image}) must be the cluster's minor version, v${var.kubernetes_version}.x: the Cluster Autoscaler supports the Kubernetes minor it was built for."
    }
  }

  depends_on = [module.cluster_autoscaler_identity]
}
