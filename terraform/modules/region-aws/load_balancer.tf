# The AWS Load Balancer Controller: it creates the network load balancer for the
# ingress controller's Service (platform.tf reads its annotations: type external, IP
# targets, internet-facing, TLS with the region's certificate). The in-tree cloud
# provider's NLB support is frozen and registers instances, not pods; the controller's
# NLBs send traffic straight to the Traefik pods' IPs.

locals {
  load_balancer_controller_service_account = "aws-load-balancer-controller"
}

# Its IAM role through EKS Pod Identity; the community module carries the controller's
# published IAM policy, kept in step with the controller's releases.
module "load_balancer_controller_identity" {
  #checkov:skip=CKV_TF_1:A registry module, pinned by version constraint as the Terraform Registry intends; a git commit source would bypass the registry's release resolution.
  source  = "terraform-aws-modules/eks-pod-identity/aws"
  version = "~> 2.6"

  name            = "${local.cluster_name}-lb-controller"
  use_name_prefix = false

  attach_aws_lb_controller_policy = true

  associations = {
    this = {
      cluster_name    = module.eks.cluster_name
      namespace       = "kube-system"
      service_account = local.load_balancer_controller_service_account
    }
  }

  tags = local.tags
}

resource "helm_release" "aws_load_balancer_controller" {
  name       = "aws-load-balancer-controller"
  repository = var.helm_repositories.aws_load_balancer_controller
  chart      = "aws-load-balancer-controller"
  version    = var.chart_versions.aws_load_balancer_controller
  namespace  = "kube-system"
  # Its webhook must answer before the ingress controller's Service is created.
  wait = true
  values = [yamlencode({
    clusterName = module.eks.cluster_name
    region      = data.aws_region.current.region
    vpcId       = var.vpc_id
    serviceAccount = {
      create = true
      name   = local.load_balancer_controller_service_account
    }
    nodeSelector = { "firstlight/pool" = "system" }
  })]

  depends_on = [module.load_balancer_controller_identity]
}
