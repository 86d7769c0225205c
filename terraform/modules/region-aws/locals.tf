# Names derived from the inputs alone (no resources), shared by the other files. The
# tests evaluate this file with variables.tf and values.tf to check the chart values.

locals {
  cluster_name    = coalesce(var.cluster_name, "firstlight-${var.region_name}")
  public_hostname = "${var.region_name}.${var.domain}"
  tags            = merge({ "firstlight/region" = var.region_name }, var.tags)
  gpu_node_labels = { "firstlight/pool" = "gpu" }

  redis_secret_name    = "firstlight-redis-external"
  api_keys_secret_name = var.api_keys_secret_name
  api_key_names        = [for i in range(var.api_key_count) : "api-key-${i}"]
}
