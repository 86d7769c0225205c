# Latency-based DNS over the regions: <domain> answers with the lowest-latency region
# whose /readyz health check passes; <region>.<domain> always names one region (peers
# and the health checks use those).

resource "aws_route53_health_check" "readyz" {
  for_each = var.regions

  fqdn              = "${each.key}.${var.domain}"
  type              = "HTTPS"
  port              = 443
  resource_path     = var.health_check.path
  request_interval  = var.health_check.request_interval
  failure_threshold = var.health_check.failure_threshold
  measure_latency   = true
  tags              = merge({ Name = "firstlight-${each.key}-readyz" }, var.tags)
}

resource "aws_route53_record" "region" {
  #checkov:skip=CKV2_AWS_23:The alias target is the network load balancer the region's ingress controller creates inside its cluster, so it is not a Terraform resource.
  for_each = var.regions

  zone_id = var.zone_id
  name    = "${each.key}.${var.domain}"
  type    = "A"

  alias {
    name                   = each.value.load_balancer_hostname
    zone_id                = each.value.load_balancer_zone_id
    evaluate_target_health = false
  }
}

resource "aws_route53_record" "latency" {
  #checkov:skip=CKV2_AWS_23:The alias target is the network load balancer the region's ingress controller creates inside its cluster, so it is not a Terraform resource.
  for_each = var.regions

  zone_id         = var.zone_id
  name            = var.domain
  type            = "A"
  set_identifier  = each.key
  health_check_id = aws_route53_health_check.readyz[each.key].id

  latency_routing_policy {
    region = each.value.aws_region
  }

  alias {
    name                   = each.value.load_balancer_hostname
    zone_id                = each.value.load_balancer_zone_id
    evaluate_target_health = true
  }
}
