variable "name" {
  description = "Name of the VPC and prefix of its subnets."
  type        = string
}

variable "cidr" {
  description = "The VPC's IPv4 block (a /16: three /20 private and three /24 public subnets are cut from it)."
  type        = string

  validation {
    condition     = can(cidrhost(var.cidr, 0)) && endswith(var.cidr, "/16")
    error_message = "cidr must be a valid /16 block such as 10.10.0.0/16."
  }
}

variable "azs" {
  description = "The three availability zones (by name) of the subnets: named, so the set never changes when AWS adds a zone."
  type        = list(string)

  validation {
    condition     = length(var.azs) == 3
    error_message = "azs must name exactly three availability zones."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
