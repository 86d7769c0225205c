# Names derived from the shared inputs alone (no resources), the same in every region
# module: region-aws holds this file, region-gke links to it. The tests evaluate it with
# the variables, the module's locals.tf and values.tf to check the chart values.

locals {
  cluster_name    = coalesce(var.cluster_name, "firstlight-${var.region_name}")
  public_hostname = "${var.region_name}.${var.domain}"
  # The GPU nodes' label (the Ray workers' nodeSelector) and taint (the chart's worker
  # group tolerates nvidia.com/gpu with any value, effect NoSchedule).
  gpu_node_labels = { "firstlight/pool" = "gpu" }
  gpu_toleration  = { key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }
  chart_path      = coalesce(var.chart_path, "${path.module}/../../../helm/firstlight")

  redis_secret_name    = "firstlight-redis-external"
  api_keys_secret_name = var.api_keys_secret_name
  api_key_names        = [for i in range(var.api_key_count) : "api-key-${i}"]
}
