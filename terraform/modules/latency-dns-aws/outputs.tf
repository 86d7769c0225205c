output "fqdn" {
  description = "The latency-routed name clients use."
  value       = var.domain
}

output "region_fqdns" {
  description = "Each region's own name, by region."
  value       = { for name, record in aws_route53_record.region : name => record.fqdn }
}

output "health_check_ids" {
  description = "Route 53 health check id of each region's /readyz, by region (for alarms)."
  value       = { for name, check in aws_route53_health_check.readyz : name => check.id }
}
