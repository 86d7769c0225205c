variable "zone_id" {
  description = "Route 53 hosted zone that holds domain."
  type        = string
}

variable "domain" {
  description = "The latency-routed name clients use (llm.example.com); each region also gets <region>.<domain>."
  type        = string

  validation {
    condition     = can(regex("^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\\.)+[a-z]{2,63}$", var.domain))
    error_message = "domain must be a lowercase DNS name such as llm.example.com."
  }
}

variable "regions" {
  description = "Regions by Firstlight region name, each the dns_target output of its region module: the AWS region keying its latency record (for a region on another cloud, the AWS region nearest it), and its load balancer: a hostname and Route 53 zone id (an AWS network load balancer, made an alias) or an IP address (a Google Cloud load balancer, an A record)."
  type = map(object({
    latency_region         = string
    load_balancer_hostname = optional(string)
    load_balancer_zone_id  = optional(string)
    load_balancer_ip       = optional(string)
  }))

  validation {
    condition     = length(var.regions) >= 1 && alltrue([for name in keys(var.regions) : can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", name))])
    error_message = "regions needs at least one entry, each keyed by a DNS-label region name."
  }

  validation {
    condition     = length(distinct([for r in values(var.regions) : r.latency_region])) == length(var.regions)
    error_message = "Latency routing needs a different latency_region (AWS region) per entry."
  }

  validation {
    condition = alltrue([for r in values(var.regions) : (
      r.load_balancer_ip == null ? (r.load_balancer_hostname != null && r.load_balancer_zone_id != null) : (r.load_balancer_hostname == null && r.load_balancer_zone_id == null && can(cidrhost("${r.load_balancer_ip}/32", 0)))
    )])
    error_message = "Each region needs either load_balancer_hostname and load_balancer_zone_id (an alias) or load_balancer_ip (an IPv4 address), not both."
  }
}

variable "health_check" {
  description = "Route 53 health check of each region's /readyz over HTTPS: seconds between checks (10 or 30) and failures before the region leaves the latency answer."
  type = object({
    path              = string
    request_interval  = number
    failure_threshold = number
  })
  default = {
    path              = "/readyz"
    request_interval  = 10
    failure_threshold = 3
  }

  validation {
    condition     = contains([10, 30], var.health_check.request_interval) && var.health_check.failure_threshold >= 1 && var.health_check.failure_threshold <= 10
    error_message = "health_check.request_interval must be 10 or 30, failure_threshold between 1 and 10."
  }
}

variable "tags" {
  description = "Tags added to the health checks."
  type        = map(string)
  default     = {}
}
