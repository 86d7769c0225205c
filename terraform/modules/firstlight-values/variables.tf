variable "region_name" {
  description = "Firstlight region name (a DNS label such as us-east); the chart's region.name."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.region_name))
    error_message = "region_name must be a DNS label: lowercase letters, digits and '-', at most 63 characters."
  }
}

variable "public_hostname" {
  description = "This region's public host name (<region>.<domain>); the Ingress serves it."
  type        = string
}

variable "global_hostname" {
  description = "The latency-routed name shared by all regions (<domain>); also served by this region's Ingress. Null for none."
  type        = string
  default     = null
}

variable "peers" {
  description = "Peer regions this region may spill over or fail over to: name, public base URL and a round-trip-time prior in milliseconds."
  type = list(object({
    region = string
    url    = string
    rtt_ms = number
  }))
  default = []

  validation {
    condition     = alltrue([for p in var.peers : can(regex("^https?://", p.url)) && p.rtt_ms >= 0])
    error_message = "Each peer needs an http(s) URL and a non-negative rtt_ms."
  }
}

variable "models" {
  description = "The chart's models list (PlatformConfig models: name, source, quantization, replicas, resources, ...)."
  type        = any
}

variable "hash_seed" {
  description = "Prefix-hash seed (every pod's PYTHONHASHSEED); the same in every region or hints never match."
  type        = number
  default     = 0

  validation {
    condition     = var.hash_seed >= 0 && var.hash_seed <= 4294967295 && floor(var.hash_seed) == var.hash_seed
    error_message = "hash_seed must be an integer between 0 and 4294967295."
  }
}

variable "image" {
  description = "Firstlight's container image (repository and tag)."
  type = object({
    repository = string
    tag        = string
  })
}

variable "gpu_node_selector" {
  description = "Node labels of the GPU node group, where the Ray worker pods go."
  type        = map(string)
  default     = {}
}

variable "gpu_worker_group" {
  description = "The Ray GPU worker group: GPUs per pod, pod bounds for Ray's autoscaler, and per-pod resources."
  type = object({
    gpus         = number
    min_replicas = number
    max_replicas = number
    cpu          = string
    memory       = string
  })
}

variable "redis_url" {
  description = "Redis URL of the hints store without credentials (rediss:// for TLS)."
  type        = string
}

variable "redis_secret_name" {
  description = "Kubernetes Secret (key 'password') holding the Redis auth token."
  type        = string
}

variable "api_keys_secret_name" {
  description = "Kubernetes Secret holding the API keys."
  type        = string
}

variable "peer_secret_name" {
  description = "Kubernetes Secret (key 'peer-secret') holding the key every region shares to sign its hops to peers; the same value in every region."
  type        = string
  default     = "firstlight-peer"
}

variable "api_key_names" {
  description = "Keys of that Secret, one API key each (never sent to peers: forwards are signed with the peer secret)."
  type        = list(string)
}

variable "ingress_class_name" {
  description = "IngressClass of the region's ingress controller."
  type        = string
  default     = "traefik"
}

variable "monitoring_enabled" {
  description = "Create the ServiceMonitor, PrometheusRule and dashboard ConfigMaps (needs the Prometheus Operator's CRDs)."
  type        = bool
  default     = false
}

variable "gateway" {
  description = "A Gateway (Gateway API) in front of the region instead of an ingress controller: the chart then renders an HTTPRoute attached to it for the same host names, and no Ingress. Null for the Ingress."
  type = object({
    name      = string
    namespace = string
  })
  default = null
}

variable "extra_values" {
  description = "More chart values (e.g. router, telemetry), deep-merged over the computed ones as Helm merges values files: objects key by key, anything else replaced."
  type        = any
  default     = {}

  validation {
    condition     = can(keys(var.extra_values))
    error_message = "extra_values must be an object of chart values (e.g. { router = { ... } })."
  }
}
