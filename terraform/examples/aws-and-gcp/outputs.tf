output "endpoint" {
  description = "The latency-routed OpenAI-compatible base URL."
  value       = "https://${var.domain}/v1"
}

output "regions" {
  description = "Per region: public URL, cluster name and hints Redis endpoint."
  value = {
    for region in [module.us_east, module.eu_central] : region.region_name => {
      url            = region.public_url
      cluster_name   = region.cluster_name
      redis_endpoint = region.redis_endpoint
    }
  }
}
