# The region's entry: GKE's Gateway controller makes a global external Application Load
# Balancer for this Gateway, on a reserved address, terminating TLS with the region's
# certificate map (tls.tf) and TLS 1.2 and up; the chart attaches its HTTPRoute to it
# (values.tf: local.gateway). The objects are Gateway API and GKE policy resources, whose
# CRDs GKE installs with the cluster (gateway_api_config), so like every Kubernetes
# object here they are applied after the cluster exists.

locals {
  serve_service = "firstlight-serve-svc" # KubeRay's Service for the release's Serve app
}

resource "google_compute_global_address" "gateway" {
  project = var.project_id
  name    = "${local.cluster_name}-gateway"
  labels  = local.labels
}

resource "kubernetes_manifest" "gateway" {
  manifest = {
    apiVersion = "gateway.networking.k8s.io/v1"
    kind       = "Gateway"
    metadata = {
      name        = local.gateway.name
      namespace   = local.gateway.namespace
      annotations = { "networking.gke.io/certmap" = google_certificate_manager_certificate_map.public.name }
    }
    spec = {
      gatewayClassName = "gke-l7-global-external-managed"
      addresses        = [{ type = "NamedAddress", value = google_compute_global_address.gateway.name }]
      listeners = [{
        name          = "https"
        protocol      = "HTTPS"
        port          = 443
        allowedRoutes = { namespaces = { from = "Same" } }
      }]
    }
  }

  depends_on = [google_certificate_manager_certificate_map_entry.public, kubernetes_namespace_v1.firstlight]
}

resource "kubernetes_manifest" "gateway_tls_policy" {
  manifest = {
    apiVersion = "networking.gke.io/v1"
    kind       = "GCPGatewayPolicy"
    metadata   = { name = "firstlight-tls", namespace = local.gateway.namespace }
    spec = {
      default   = { sslPolicy = google_compute_ssl_policy.public.name }
      targetRef = { group = "gateway.networking.k8s.io", kind = "Gateway", name = local.gateway.name }
    }
  }

  depends_on = [kubernetes_manifest.gateway]
}

# The load balancer's health check of the Serve pods: /healthz (the gateway is up), not
# /readyz, so a region with no ready replica still receives requests and fails them
# over to its peers; Route 53 checks /readyz to take it out of the shared name.
resource "kubernetes_manifest" "serve_health_check" {
  manifest = {
    apiVersion = "networking.gke.io/v1"
    kind       = "HealthCheckPolicy"
    metadata   = { name = "firstlight-serve", namespace = var.namespace }
    spec = {
      default = {
        config = {
          type            = "HTTP"
          httpHealthCheck = { port = 8000, requestPath = "/healthz" }
        }
      }
      targetRef = { group = "", kind = "Service", name = local.serve_service }
    }
  }

  depends_on = [kubernetes_namespace_v1.firstlight]
}

# Responses are streamed: the load balancer's response timeout must outlast an answer.
resource "kubernetes_manifest" "serve_backend" {
  manifest = {
    apiVersion = "networking.gke.io/v1"
    kind       = "GCPBackendPolicy"
    metadata   = { name = "firstlight-serve", namespace = var.namespace }
    spec = {
      default   = { timeoutSec = var.backend_timeout_s }
      targetRef = { group = "", kind = "Service", name = local.serve_service }
    }
  }

  depends_on = [kubernetes_namespace_v1.firstlight]
}
