# GCP inputs of the region; the inputs every region module shares are in
# firstlight_variables.tf (linked from region-aws).

variable "project_id" {
  description = "Google Cloud project of the cluster, the Redis instance, the certificate and the load balancer."
  type        = string
}

variable "gcp_region" {
  description = "Google Cloud region of the cluster (europe-west3); the cluster is regional, its control plane and nodes spread over the region's zones."
  type        = string
}

variable "latency_region" {
  description = "The AWS region whose latency Route 53 measures for this region (latency-dns-aws keys records by AWS region): the one nearest gcp_region, e.g. eu-central-1 for europe-west3 (both Frankfurt)."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.latency_region))
    error_message = "latency_region must be an AWS region name such as eu-central-1."
  }
}

variable "labels" {
  description = "Labels added to every Google Cloud resource that takes them (keys: lowercase letters, digits, '-' and '_')."
  type        = map(string)
  default     = {}
}

variable "network" {
  description = "VPC network (self link or name) of the cluster and the Redis instance."
  type        = string
}

variable "subnetwork" {
  description = "Subnetwork of the nodes in gcp_region, with secondary ranges for pods and services."
  type        = string
}

variable "pods_range_name" {
  description = "Name of the subnetwork's secondary range for pod IPs (VPC-native cluster)."
  type        = string
}

variable "services_range_name" {
  description = "Name of the subnetwork's secondary range for Service IPs."
  type        = string
}

variable "master_ipv4_cidr_block" {
  description = "A /28 for the control plane's private endpoint, unused elsewhere in the network."
  type        = string
  default     = "172.16.0.0/28"

  validation {
    condition     = can(cidrhost(var.master_ipv4_cidr_block, 0)) && endswith(var.master_ipv4_cidr_block, "/28")
    error_message = "master_ipv4_cidr_block must be a /28 CIDR block."
  }
}

variable "system_node_group" {
  description = "The CPU node pool for the Ray head, the gateway pods and system pods; GKE's cluster autoscaler keeps it between min_size and max_size nodes (over the whole region)."
  type = object({
    machine_type = string
    min_size     = number
    max_size     = number
  })
  default = {
    machine_type = "e2-standard-4"
    min_size     = 1
    max_size     = 4
  }

  validation {
    condition     = var.system_node_group.min_size >= 1 && var.system_node_group.min_size <= var.system_node_group.max_size
    error_message = "system_node_group needs 1 <= min_size <= max_size."
  }
}

variable "gpu_node_group" {
  description = "The GPU node pool for the Ray workers (model replicas): machine type and accelerator (a G2 machine with NVIDIA L4s by default), in zones that offer it. GKE's cluster autoscaler keeps it between min_size and max_size nodes over those zones; min_size 0 lets an idle region scale its GPUs to zero."
  type = object({
    machine_type     = string
    accelerator_type = string
    gpus_per_node    = number
    min_size         = number
    max_size         = number
    disk_size_gib    = number
    zones            = list(string)
  })
  default = {
    machine_type     = "g2-standard-8"
    accelerator_type = "nvidia-l4"
    gpus_per_node    = 1
    min_size         = 1
    max_size         = 4
    disk_size_gib    = 200
    zones            = []
  }

  validation {
    condition     = var.gpu_node_group.min_size >= 0 && var.gpu_node_group.min_size <= var.gpu_node_group.max_size && var.gpu_node_group.gpus_per_node >= 1
    error_message = "gpu_node_group needs 0 <= min_size <= max_size and gpus_per_node >= 1."
  }
}

variable "redis_memory_size_gb" {
  description = "Memorystore for Redis capacity in GiB (hints are small: block hashes per replica)."
  type        = number
  default     = 1
}

variable "redis_version" {
  description = "Memorystore Redis version (REDIS_7_2)."
  type        = string
  default     = "REDIS_7_2"
}

variable "backend_timeout_s" {
  description = "Seconds the load balancer waits for a whole response: a streamed answer must finish within it."
  type        = number
  default     = 900

  validation {
    condition     = var.backend_timeout_s >= 30 && var.backend_timeout_s <= 86400
    error_message = "backend_timeout_s must be between 30 and 86400."
  }
}

variable "helm_repositories" {
  description = "Helm repositories of the charts installed beside Firstlight: KubeRay's (from its installation guide). GKE installs the NVIDIA drivers and device plugin and runs the load balancer's controller itself; an object with more repositories (region-aws's) is accepted, the rest unused."
  type = object({
    kuberay = string
  })

  validation {
    condition     = can(regex("^(https|oci)://", var.helm_repositories.kuberay))
    error_message = "The KubeRay Helm repository must be an https:// or oci:// URL."
  }
}

variable "chart_versions" {
  description = "Pinned versions of the charts installed beside Firstlight."
  type = object({
    kuberay_operator = string
  })
  default = {
    kuberay_operator = "1.5.1"
  }
}
