# The region's hints store (and the Ray head's GCS state): Memorystore for Redis,
# Standard tier (a replica with automatic fail-over in another zone), AUTH on,
# reachable only from the VPC through private service access.
#
# In transit it is not encrypted: Memorystore's TLS presents a certificate from a CA of
# the instance's own, which the platform and Ray's GCS would have to be given, and the
# chart passes a CA only to its in-chart Redis (redis.tls), not to an external one. The
# README says so; the AUTH string is in the state, like ElastiCache's token in
# region-aws.

resource "google_redis_instance" "hints" {
  #checkov:skip=CKV_GCP_97:Memorystore's TLS uses a per-instance CA that the chart cannot yet hand to the platform and Ray's GCS for an external Redis; the instance is reachable only from the VPC over private service access, with AUTH on, and holds block hashes and Ray metadata, no prompts.
  project                 = var.project_id
  name                    = "${local.cluster_name}-hints"
  region                  = var.gcp_region
  tier                    = "STANDARD_HA"
  memory_size_gb          = var.redis_memory_size_gb
  redis_version           = var.redis_version
  authorized_network      = var.network
  connect_mode            = "PRIVATE_SERVICE_ACCESS"
  auth_enabled            = true
  transit_encryption_mode = "DISABLED"
  labels                  = local.labels
}

locals {
  redis_url = "redis://${google_redis_instance.hints.host}:${google_redis_instance.hints.port}/0"
}
