# The region's hints store (and the Ray head's GCS state): ElastiCache Redis with TLS in
# transit, encryption at rest and an auth token. The token is generated here and handed
# to the platform only through a Kubernetes Secret (platform.tf); no output carries it.
#
# The token is in Terraform's state, unlike the API keys: ElastiCache takes its value as
# the replication group's auth_token argument (no write-only form of it is assumed
# here), and ElastiCache has no option like RDS's manage_master_user_password that would
# keep it in Secrets Manager only. Whoever reads the state reads the token: keep the
# state in an encrypted backend readable only by the deployers. The token guards a
# Redis reachable only from the cluster's nodes (the security group below); see the
# module README.

resource "random_password" "redis_auth" {
  length = 48
  # ElastiCache tokens allow printable ASCII except '@', '"' and '/'.
  override_special = "!&#$^<>-"
}

resource "aws_elasticache_subnet_group" "hints" {
  name       = "${local.cluster_name}-hints"
  subnet_ids = var.private_subnet_ids
  tags       = local.tags
}

resource "aws_security_group" "hints" {
  name        = "${local.cluster_name}-hints"
  description = "Firstlight hints Redis: reachable from the cluster's nodes only"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "hints_from_nodes" {
  security_group_id            = aws_security_group.hints.id
  description                  = "Redis (TLS) from the EKS nodes"
  referenced_security_group_id = module.eks.node_security_group_id
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
}

resource "aws_elasticache_replication_group" "hints" {
  #checkov:skip=CKV_AWS_191:Encrypted at rest with the AWS-managed key; the store holds prefix-block hashes per replica, no prompts or user data, so a customer-managed key adds cost without protecting anything more.
  replication_group_id       = "${local.cluster_name}-hints"
  description                = "Firstlight prefix-cache hints for region ${var.region_name}"
  engine                     = "redis"
  engine_version             = var.redis_engine_version
  node_type                  = var.redis_node_type
  num_cache_clusters         = var.redis_num_cache_clusters
  port                       = 6379
  automatic_failover_enabled = true
  multi_az_enabled           = true
  subnet_group_name          = aws_elasticache_subnet_group.hints.name
  security_group_ids         = [aws_security_group.hints.id]
  at_rest_encryption_enabled = true
  transit_encryption_enabled = true
  auth_token                 = random_password.redis_auth.result
  apply_immediately          = true
  tags                       = local.tags
}

locals {
  redis_url = "rediss://${aws_elasticache_replication_group.hints.primary_endpoint_address}:6379/0"
}
