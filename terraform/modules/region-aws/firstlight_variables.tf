# The inputs every region module takes, whichever the cloud: region-aws holds this file,
# region-gke links to it, so a fleet gives both the same Firstlight settings and the
# firstlight-values module (values.tf, linked too) builds the chart's values the same
# way. Cloud-specific inputs are in variables.tf.

variable "region_name" {
  description = "Firstlight region name, a DNS label (us-east). Names the region in metrics and headers and is the first label of its public host name."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.region_name))
    error_message = "region_name must be a DNS label: lowercase letters, digits and '-', at most 63 characters."
  }
}

variable "domain" {
  description = "DNS domain of the deployment (llm.example.com): this region serves <region_name>.<domain> and the latency-routed <domain> itself."
  type        = string

  validation {
    condition     = can(regex("^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\\.)+[a-z]{2,63}$", var.domain))
    error_message = "domain must be a lowercase DNS name such as llm.example.com."
  }
}

variable "zone_id" {
  description = "Route 53 hosted zone of domain (the fleet's DNS, latency-dns-aws): the region's TLS certificate is validated through records in it."
  type        = string
}

variable "peers" {
  description = "Peer regions (their region_name) with a round-trip-time prior in milliseconds. Their URLs follow from the names (https://<region>.<domain>), so peers can be set before any load balancer exists."
  type = list(object({
    region = string
    rtt_ms = number
  }))
  default = []

  validation {
    condition     = alltrue([for p in var.peers : p.rtt_ms >= 0 && p.rtt_ms <= 10000])
    error_message = "Each peer's rtt_ms must be between 0 and 10000."
  }
}

variable "cluster_name" {
  description = "Kubernetes cluster name (EKS or GKE); null for firstlight-<region_name>."
  type        = string
  default     = null
}

variable "kubernetes_version" {
  description = "Kubernetes version of the cluster, major.minor (the chart needs 1.27 or later)."
  type        = string
  default     = "1.33"

  validation {
    condition     = can(regex("^1\\.(2[7-9]|[3-9][0-9])$", var.kubernetes_version))
    error_message = "kubernetes_version must be 1.27 or later, as major.minor (1.33)."
  }
}

variable "endpoint_public_access_cidrs" {
  description = "CIDR blocks allowed to reach the Kubernetes API's public endpoint (where Terraform and operators run). Required, no default: [] keeps the endpoint private (reachable from the region's network only, so Terraform must run there, e.g. over a VPN); opening it to everyone takes writing 0.0.0.0/0 here."
  type        = list(string)

  validation {
    condition     = alltrue([for c in var.endpoint_public_access_cidrs : can(cidrhost(c, 0))])
    error_message = "endpoint_public_access_cidrs must be CIDR blocks (203.0.113.0/24); [] for a private endpoint only."
  }
}

variable "image" {
  description = "Firstlight's container image, built from the repository's Dockerfile and pushed to a registry the nodes can pull from."
  type = object({
    repository = string
    tag        = string
  })
}

variable "models" {
  description = "Models served in the region: the chart's models list (PlatformConfig models: name, source, quantization, replicas, resources, ...)."
  type        = any
  default = [{
    name      = "SmolLM2-135M-Instruct"
    source    = "default"
    replicas  = 1
    resources = { num_cpus = 2, num_gpus = 1 }
  }]
}

variable "hash_seed" {
  description = "Prefix-hash seed, every pod's PYTHONHASHSEED: the same in every region, or hints never match."
  type        = number
  default     = 0

  validation {
    condition     = var.hash_seed >= 0 && var.hash_seed <= 4294967295 && floor(var.hash_seed) == var.hash_seed
    error_message = "hash_seed must be an integer between 0 and 4294967295."
  }
}

variable "peer_secret_name" {
  description = "Kubernetes Secret in namespace holding the key the regions share to sign their hops (key 'peer-secret'), created outside Terraform with the same value in every region (kubectl create secret generic firstlight-peer --from-literal=peer-secret=...), so the key is in no Terraform state."
  type        = string
  default     = "firstlight-peer"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", var.peer_secret_name))
    error_message = "peer_secret_name must be a Kubernetes object name."
  }
}

variable "api_keys_secret_name" {
  description = "Kubernetes Secret in namespace holding the API keys, created outside Terraform (kubectl create secret generic ... --from-literal=api-key-0=...) so no key is in Terraform's state. Keys api-key-0 ... api-key-<api_key_count - 1>; each region may have its own (forwards to peers are signed with the peer secret, not a client key)."
  type        = string
  default     = "firstlight-api-keys"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", var.api_keys_secret_name))
    error_message = "api_keys_secret_name must be a Kubernetes object name."
  }
}

variable "api_key_count" {
  description = "How many API keys that Secret holds (keys api-key-0, api-key-1, ...); the chart mounts each."
  type        = number
  default     = 1

  validation {
    condition     = var.api_key_count >= 1 && floor(var.api_key_count) == var.api_key_count
    error_message = "api_key_count must be a whole number of at least 1."
  }
}

variable "gpu_worker_resources" {
  description = "CPU and memory of each Ray GPU worker pod (leave room for the node's system pods)."
  type = object({
    cpu    = string
    memory = string
  })
  default = {
    cpu    = "6"
    memory = "24Gi"
  }
}

variable "monitoring_enabled" {
  description = "Create the chart's ServiceMonitor, PrometheusRule and Grafana dashboard ConfigMaps (the cluster must run the Prometheus Operator)."
  type        = bool
  default     = false
}

variable "extra_values" {
  description = "More Firstlight chart values (router, telemetry, gateway, ...), deep-merged over the computed ones as Helm merges values files: objects key by key, anything else replaced."
  type        = any
  default     = {}
}

variable "namespace" {
  description = "Namespace of the Firstlight release and its Secrets."
  type        = string
  default     = "firstlight"
}

variable "chart_path" {
  description = "Path of the Firstlight chart; null for this repository's helm/firstlight."
  type        = string
  default     = null
}
