variable "project_id" {
  description = "Google Cloud project of the network."
  type        = string
}

variable "name" {
  description = "Name of the network and prefix of its other resources."
  type        = string
}

variable "region" {
  description = "Google Cloud region of the subnetwork, its router and NAT."
  type        = string
}

variable "cidr" {
  description = "The subnetwork's IPv4 block for nodes (a /20); pods and Services get secondary ranges of their own."
  type        = string

  validation {
    condition     = can(cidrhost(var.cidr, 0)) && endswith(var.cidr, "/20")
    error_message = "cidr must be a valid /20 block such as 10.40.0.0/20."
  }
}

variable "pods_cidr" {
  description = "Secondary range for pod IPs (a /14 leaves room for many nodes)."
  type        = string
  default     = "10.64.0.0/14"
}

variable "services_cidr" {
  description = "Secondary range for Service IPs."
  type        = string
  default     = "10.68.0.0/20"
}
