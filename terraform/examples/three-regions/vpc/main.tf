# A region's network: private subnets in three named availability zones for nodes and Redis,
# public subnets for the network load balancer, one NAT gateway per zone.

module "vpc" {
  #checkov:skip=CKV_TF_1:A registry module, pinned by version constraint as the Terraform Registry intends; a git commit source would bypass the registry's release resolution.
  source  = "terraform-aws-modules/vpc/aws"
  version = "~> 6.0"

  name = var.name
  cidr = var.cidr
  azs  = var.azs

  private_subnets = [for i in range(3) : cidrsubnet(var.cidr, 4, i)]
  public_subnets  = [for i in range(3) : cidrsubnet(var.cidr, 8, 48 + i)]

  enable_nat_gateway     = true
  one_nat_gateway_per_az = true

  # Where Kubernetes puts load balancers: public for the ingress, private for internal.
  public_subnet_tags  = { "kubernetes.io/role/elb" = "1" }
  private_subnet_tags = { "kubernetes.io/role/internal-elb" = "1" }

  tags = var.tags
}
