# Latency-based DNS over the regions: <domain> answers with the lowest-latency region
# whose /readyz health check passes; <region>.<domain> always names one region (peers
# and the health checks use those). A region on AWS is an alias of its network load
# balancer; a region elsewhere (region-gke) is an A record of its load balancer's
# address, keyed for latency by the AWS region nearest it.

locals {
  address_ttl = 60 # seconds, for A records of addresses (an alias takes its target's)
}

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
  #checkov:skip=CKV2_AWS_23:The target is the region's load balancer, made inside its cluster (an NLB by the AWS Load Balancer Controller) or on another cloud (an IP), so it is not a Terraform resource here.
  for_each = var.regions

  zone_id = var.zone_id
  name    = "${each.key}.${var.domain}"
  type    = "A"
  records = each.value.load_balancer_ip == null ? null : [each.value.load_balancer_ip]
  ttl     = each.value.load_balancer_ip == null ? null : local.address_ttl

  dynamic "alias" {
    for_each = each.value.load_balancer_ip == null ? [each.value] : []
    content {
      name                   = alias.value.load_balancer_hostname
      zone_id                = alias.value.load_balancer_zone_id
      evaluate_target_health = false
    }
  }
}

resource "aws_route53_record" "latency" {
  #checkov:skip=CKV2_AWS_23:The target is the region's load balancer, made inside its cluster (an NLB by the AWS Load Balancer Controller) or on another cloud (an IP), so it is not a Terraform resource here.
  for_each = var.regions

  zone_id         = var.zone_id
  name            = var.domain
  type            = "A"
  set_identifier  = each.key
  health_check_id = aws_route53_health_check.readyz[each.key].id
  records         = each.value.load_balancer_ip == null ? null : [each.value.load_balancer_ip]
  ttl             = each.value.load_balancer_ip == null ? null : local.address_ttl

  latency_routing_policy {
    region = each.value.latency_region
  }

  dynamic "alias" {
    for_each = each.value.load_balancer_ip == null ? [each.value] : []
    content {
      name                   = alias.value.load_balancer_hostname
      zone_id                = alias.value.load_balancer_zone_id
      evaluate_target_health = true
    }
  }
}
