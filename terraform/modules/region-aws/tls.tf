# The region's certificate, for its own name and the latency-routed domain, validated
# through DNS. The network load balancer in front of the ingress controller terminates
# TLS with it (platform.tf), so no certificate manager runs in the cluster.

resource "aws_acm_certificate" "public" {
  domain_name               = local.public_hostname
  subject_alternative_names = [var.domain]
  validation_method         = "DNS"
  tags                      = local.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_route53_record" "certificate_validation" {
  for_each = {
    for option in aws_acm_certificate.public.domain_validation_options : option.domain_name => option
  }

  zone_id         = var.zone_id
  name            = each.value.resource_record_name
  type            = each.value.resource_record_type
  records         = [each.value.resource_record_value]
  ttl             = 300
  allow_overwrite = true
}

resource "aws_acm_certificate_validation" "public" {
  certificate_arn         = aws_acm_certificate.public.arn
  validation_record_fqdns = [for record in aws_route53_record.certificate_validation : record.fqdn]
}
