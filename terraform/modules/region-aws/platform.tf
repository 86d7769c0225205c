# What runs in the cluster: the NVIDIA device plugin, the ingress controller (Traefik)
# behind a TLS-terminating network load balancer (made by the AWS Load Balancer
# Controller, load_balancer.tf), the KubeRay operator, the Redis token's Secret, and the
# Firstlight chart itself.

resource "kubernetes_namespace_v1" "firstlight" {
  metadata {
    name   = var.namespace
    labels = { "app.kubernetes.io/part-of" = "firstlight" }
  }
}

# The API keys' Secret (var.api_keys_secret_name) is created outside Terraform, so the
# keys never enter its state; the Ray pods start once it exists. The Redis token below
# is in the state anyway (ElastiCache takes it as auth_token, see redis.tf), so writing
# it into a Secret from here adds no exposure.
resource "kubernetes_secret_v1" "redis" {
  metadata {
    name      = local.redis_secret_name
    namespace = kubernetes_namespace_v1.firstlight.metadata[0].name
  }
  data = { password = random_password.redis_auth.result }
}

resource "helm_release" "nvidia_device_plugin" {
  name       = "nvidia-device-plugin"
  repository = var.helm_repositories.nvidia_device_plugin
  chart      = "nvidia-device-plugin"
  version    = var.chart_versions.nvidia_device_plugin
  namespace  = "kube-system"
  values = [yamlencode({
    nodeSelector = local.gpu_node_labels
    tolerations  = [local.gpu_toleration]
  })]
}

resource "helm_release" "ingress" {
  name             = "traefik"
  repository       = var.helm_repositories.traefik
  chart            = "traefik"
  version          = var.chart_versions.traefik
  namespace        = "traefik"
  create_namespace = true
  # Waits until the load balancer has a DNS name (read below for the DNS records).
  wait = true
  values = [yamlencode({
    nodeSelector = { "firstlight/pool" = "system" }
    ingressClass = { enabled = true, isDefaultClass = false }
    # Ingress status carries the load balancer's name (firstlight status shows it).
    providers = { kubernetesIngress = { publishedService = { enabled = true } } }
    ports = {
      # TLS ends at the load balancer: the websecure entry point receives plain HTTP.
      websecure = { tls = { enabled = false } }
    }
    # Annotations the AWS Load Balancer Controller reads (load_balancer.tf); the in-tree
    # provider leaves a Service of type "external" alone.
    service = {
      annotations = {
        "service.beta.kubernetes.io/aws-load-balancer-type"             = "external"
        "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"  = "ip"
        "service.beta.kubernetes.io/aws-load-balancer-scheme"           = "internet-facing"
        "service.beta.kubernetes.io/aws-load-balancer-ssl-cert"         = aws_acm_certificate_validation.public.certificate_arn
        "service.beta.kubernetes.io/aws-load-balancer-ssl-ports"        = "443"
        "service.beta.kubernetes.io/aws-load-balancer-backend-protocol" = "tcp"
        # TLS 1.2 and 1.3 only (the provider's default policy still allows 1.0 and 1.1).
        "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy" = "ELBSecurityPolicy-TLS13-1-2-2021-06"
      }
    }
  })]

  # The controller makes the load balancer, and on destroy must outlive this release to
  # delete it (else the NLB is orphaned and blocks the VPC's deletion).
  depends_on = [helm_release.aws_load_balancer_controller]
}

resource "helm_release" "kuberay_operator" {
  name             = "kuberay-operator"
  repository       = var.helm_repositories.kuberay
  chart            = "kuberay-operator"
  version          = var.chart_versions.kuberay_operator
  namespace        = "kuberay-system"
  create_namespace = true
}

resource "helm_release" "firstlight" {
  name      = "firstlight"
  chart     = local.chart_path
  namespace = kubernetes_namespace_v1.firstlight.metadata[0].name
  values    = [yamlencode(module.values.values)]
  # The RayService becomes ready only after GPU nodes join and models load (minutes);
  # `firstlight status` and the DNS health checks follow it instead of Terraform.
  wait = false

  depends_on = [
    helm_release.kuberay_operator,
    helm_release.ingress,
    helm_release.nvidia_device_plugin,
    kubernetes_secret_v1.redis,
  ]
}

data "kubernetes_service_v1" "ingress" {
  metadata {
    name      = helm_release.ingress.name
    namespace = helm_release.ingress.namespace
  }
}

data "aws_lb_hosted_zone_id" "network" {
  load_balancer_type = "network"
}
