output "vpc_id" {
  description = "The VPC's id."
  value       = module.vpc.vpc_id
}

output "private_subnet_ids" {
  description = "Private subnet ids, one per availability zone."
  value       = module.vpc.private_subnets
}
