# The region's certificate, for its own name and the latency-routed domain: managed by
# Certificate Manager and authorized through DNS (records in the fleet's Route 53 zone),
# so it is issued for the shared domain too, whichever region that name resolves to.
# The load balancer (gateway.tf) terminates TLS with it through a certificate map.

locals {
  certificate_domains = {
    region = local.public_hostname
    global = var.domain
  }
}

resource "google_certificate_manager_dns_authorization" "public" {
  for_each = local.certificate_domains

  project = var.project_id
  name    = "${local.cluster_name}-${each.key}"
  domain  = each.value
  # A record name of this project's own, so regions of other projects (or clouds)
  # authorize the same domain side by side.
  type   = "PER_PROJECT_RECORD"
  labels = local.labels
}

resource "aws_route53_record" "certificate_authorization" {
  for_each = local.certificate_domains

  zone_id = var.zone_id
  name    = google_certificate_manager_dns_authorization.public[each.key].dns_resource_record[0].name
  type    = google_certificate_manager_dns_authorization.public[each.key].dns_resource_record[0].type
  records = [google_certificate_manager_dns_authorization.public[each.key].dns_resource_record[0].data]
  ttl     = 300
}

resource "google_certificate_manager_certificate" "public" {
  project = var.project_id
  name    = "${local.cluster_name}-public"
  labels  = local.labels

  managed {
    domains            = values(local.certificate_domains)
    dns_authorizations = [for auth in google_certificate_manager_dns_authorization.public : auth.id]
  }

  depends_on = [aws_route53_record.certificate_authorization]
}

resource "google_certificate_manager_certificate_map" "public" {
  project = var.project_id
  name    = "${local.cluster_name}-public"
  labels  = local.labels
}

resource "google_certificate_manager_certificate_map_entry" "public" {
  for_each = local.certificate_domains

  project      = var.project_id
  name         = "${local.cluster_name}-${each.key}"
  map          = google_certificate_manager_certificate_map.public.name
  hostname     = each.value
  certificates = [google_certificate_manager_certificate.public.id]
  labels       = local.labels
}

# TLS 1.2 and 1.3 only, with the RESTRICTED profile's ciphers.
resource "google_compute_ssl_policy" "public" {
  project         = var.project_id
  name            = "${local.cluster_name}-tls12"
  min_tls_version = "TLS_1_2"
  profile         = "RESTRICTED"
}
