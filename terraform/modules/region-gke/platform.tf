# What runs in the cluster besides the Gateway (gateway.tf): the KubeRay operator, the
# Redis AUTH string's Secret, and the Firstlight chart itself. GKE runs the NVIDIA
# driver and device plugin on GPU nodes itself.

resource "kubernetes_namespace_v1" "firstlight" {
  metadata {
    name   = var.namespace
    labels = { "app.kubernetes.io/part-of" = "firstlight" }
  }
}

# The API keys' and peer secret's Secrets are created outside Terraform, as in
# region-aws. The AUTH string below is in the state anyway (Memorystore generates it and
# the provider reads it back), so writing it into a Secret from here adds no exposure.
resource "kubernetes_secret_v1" "redis" {
  metadata {
    name      = local.redis_secret_name
    namespace = kubernetes_namespace_v1.firstlight.metadata[0].name
  }
  data = { password = google_redis_instance.hints.auth_string }
}

resource "helm_release" "kuberay_operator" {
  name             = "kuberay-operator"
  repository       = var.helm_repositories.kuberay
  chart            = "kuberay-operator"
  version          = var.chart_versions.kuberay_operator
  namespace        = "kuberay-system"
  create_namespace = true
  values           = [yamlencode({ nodeSelector = { "firstlight/pool" = "system" } })]
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
    kubernetes_manifest.gateway,
    kubernetes_secret_v1.redis,
  ]
}
