output "region_name" {
  description = "The Firstlight region name."
  value       = var.region_name
}

output "gcp_region" {
  description = "The Google Cloud region the cluster runs in."
  value       = var.gcp_region
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
  description = "GKE cluster name (gcloud container clusters get-credentials ...)."
  value       = google_container_cluster.this.name
}

output "cluster_endpoint" {
  description = "Kubernetes API endpoint of the cluster (https://...)."
  value       = "https://${google_container_cluster.this.endpoint}"
}

output "cluster_certificate_authority_data" {
  description = "Base64 CA certificate of the cluster's API endpoint (for kubernetes/helm providers)."
  value       = google_container_cluster.this.master_auth[0].cluster_ca_certificate
}

output "redis_endpoint" {
  description = "The hints Redis host:port (in the VPC only). The AUTH string is only in the cluster's Secret."
  value       = "${google_redis_instance.hints.host}:${google_redis_instance.hints.port}"
}

output "load_balancer_ip" {
  description = "The reserved global address of the region's load balancer (the Gateway's)."
  value       = google_compute_global_address.gateway.address
}

output "dns_target" {
  description = "What latency-dns-aws needs of the region, the same shape from every region module: the AWS region keying its latency record (latency_region), and its load balancer's address (here an IP; hostname and zone are null)."
  value = {
    latency_region         = var.latency_region
    load_balancer_hostname = null
    load_balancer_zone_id  = null
    load_balancer_ip       = google_compute_global_address.gateway.address
  }
}

output "chart_values" {
  description = "The values given to the Firstlight chart (no secrets: those are Secret references)."
  value       = module.values.values
}
