# The Firstlight chart's values for this region, computed by the pure firstlight-values
# module; the same in every region module (region-aws holds this file, region-gke links
# to it). The tests evaluate it with the variables, locals.tf, firstlight_locals.tf and
# the module's defaults, and check the result against the chart's values.schema.json;
# so it may only reference variables, those locals, and local.redis_url (the module's
# Redis).

module "values" {
  source = "../firstlight-values"

  region_name     = var.region_name
  public_hostname = local.public_hostname
  global_hostname = var.domain
  peers = [
    for peer in var.peers : {
      region = peer.region
      url    = "https://${peer.region}.${var.domain}"
      rtt_ms = peer.rtt_ms
    }
  ]
  models               = var.models
  hash_seed            = var.hash_seed
  image                = var.image
  gpu_node_selector    = local.gpu_node_labels
  redis_url            = local.redis_url
  redis_secret_name    = local.redis_secret_name
  api_keys_secret_name = local.api_keys_secret_name
  peer_secret_name     = var.peer_secret_name
  api_key_names        = local.api_key_names
  monitoring_enabled   = var.monitoring_enabled
  extra_values         = var.extra_values
  gateway              = local.gateway
  gpu_worker_group = {
    gpus         = var.gpu_node_group.gpus_per_node
    min_replicas = var.gpu_node_group.min_size
    max_replicas = var.gpu_node_group.max_size
    cpu          = var.gpu_worker_resources.cpu
    memory       = var.gpu_worker_resources.memory
  }
}
