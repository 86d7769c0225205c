output "region_name" {
  description = "The Firstlight region name."
  value       = var.region_name
}

output "aws_region" {
  description = "The AWS region the cluster runs in (for latency-based DNS)."
  value       = data.aws_region.current.region
}

output "public_hostname" {
  description = "The region's public host name, <region_name>.<domain>."
  value       = local.public_hostname
}

output "public_url" {
  description = "The region's OpenAI-compatible base URL."
  value       = "https://${local.public_hostname}/v1"
}

output "cluster_name" {
  description = "EKS cluster name (aws eks update-kubeconfig --name ...)."
  value       = module.eks.cluster_name
}

output "cluster_endpoint" {
  description = "Kubernetes API endpoint of the cluster."
  value       = module.eks.cluster_endpoint
}

output "cluster_certificate_authority_data" {
  description = "Base64 CA certificate of the cluster's API endpoint (for kubernetes/helm providers)."
  value       = module.eks.cluster_certificate_authority_data
}

output "redis_endpoint" {
  description = "Primary endpoint of the hints Redis (host:port, TLS). The auth token is only in the cluster's Secret."
  value       = "${aws_elasticache_replication_group.hints.primary_endpoint_address}:6379"
}

output "load_balancer_hostname" {
  description = "DNS name of the network load balancer in front of the region's ingress controller."
  value       = data.kubernetes_service_v1.ingress.status[0].load_balancer[0].ingress[0].hostname
}

output "load_balancer_zone_id" {
  description = "Route 53 zone id of network load balancers in this AWS region (for alias records)."
  value       = data.aws_lb_hosted_zone_id.network.id
}

output "chart_values" {
  description = "The values given to the Firstlight chart (no secrets: those are Secret references)."
  value       = module.values.values
}

output "dns_target" {
  description = "What latency-dns-aws needs of the region, the same shape from every region module: the AWS region keying its latency record, and its load balancer (here an alias target: hostname and zone; load_balancer_ip is null)."
  value = {
    latency_region         = data.aws_region.current.region
    load_balancer_hostname = data.kubernetes_service_v1.ingress.status[0].load_balancer[0].ingress[0].hostname
    load_balancer_zone_id  = data.aws_lb_hosted_zone_id.network.id
    load_balancer_ip       = null
  }
}
