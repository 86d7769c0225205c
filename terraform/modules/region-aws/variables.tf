# AWS inputs of the region; the inputs every region module shares are in
# firstlight_variables.tf.

variable "tags" {
  description = "Tags added to every AWS resource."
  type        = map(string)
  default     = {}
}

variable "vpc_id" {
  description = "VPC of the cluster and the Redis replication group."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets (at least two availability zones) for nodes and Redis."
  type        = list(string)

  validation {
    condition     = length(var.private_subnet_ids) >= 2
    error_message = "private_subnet_ids needs subnets in at least two availability zones."
  }
}

variable "system_node_group" {
  description = "The CPU node group for the Ray head, the gateway pods, Redis-free system pods and the ingress controller."
  type = object({
    instance_types = list(string)
    min_size       = number
    max_size       = number
    desired_size   = number
  })
  default = {
    instance_types = ["m6i.xlarge"]
    min_size       = 2
    max_size       = 4
    desired_size   = 2
  }

  validation {
    condition     = var.system_node_group.min_size >= 1 && var.system_node_group.min_size <= var.system_node_group.max_size
    error_message = "system_node_group needs 1 <= min_size <= max_size."
  }
}

variable "gpu_node_group" {
  description = "The GPU node group for the Ray workers (model replicas). The Cluster Autoscaler keeps it between min_size and max_size (desired_size is only the size at creation); min_size 0 lets an idle region scale its GPUs to zero."
  type = object({
    instance_types = list(string)
    ami_type       = string
    gpus_per_node  = number
    min_size       = number
    max_size       = number
    desired_size   = number
    disk_size_gib  = number
    # The Cluster Autoscaler's GPU label value (k8s.amazonaws.com/accelerator).
    accelerator = optional(string, "nvidia-l4")
  })
  default = {
    instance_types = ["g6.2xlarge"]
    ami_type       = "AL2023_x86_64_NVIDIA"
    gpus_per_node  = 1
    min_size       = 1
    max_size       = 4
    desired_size   = 1
    disk_size_gib  = 200
    accelerator    = "nvidia-l4"
  }

  validation {
    condition     = contains(["AL2023_x86_64_NVIDIA", "AL2023_ARM_64_NVIDIA", "BOTTLEROCKET_x86_64_NVIDIA", "BOTTLEROCKET_ARM_64_NVIDIA"], var.gpu_node_group.ami_type)
    error_message = "gpu_node_group.ami_type must be an EKS NVIDIA AMI type (AL2023_x86_64_NVIDIA, AL2023_ARM_64_NVIDIA, BOTTLEROCKET_x86_64_NVIDIA or BOTTLEROCKET_ARM_64_NVIDIA)."
  }

  validation {
    condition     = var.gpu_node_group.min_size >= 0 && var.gpu_node_group.min_size <= var.gpu_node_group.max_size && var.gpu_node_group.gpus_per_node >= 1
    error_message = "gpu_node_group needs 0 <= min_size <= max_size and gpus_per_node >= 1."
  }
}

variable "redis_node_type" {
  description = "ElastiCache node type of the hints store (hints are small: block hashes per replica)."
  type        = string
  default     = "cache.t4g.medium"
}

variable "redis_engine_version" {
  description = "Redis engine version (major.minor)."
  type        = string
  default     = "7.1"
}

variable "redis_num_cache_clusters" {
  description = "Redis nodes: 2 or more gives a replica with automatic fail-over across availability zones."
  type        = number
  default     = 2

  validation {
    condition     = var.redis_num_cache_clusters >= 2 && var.redis_num_cache_clusters <= 6
    error_message = "redis_num_cache_clusters must be between 2 and 6 (a primary and at least one replica)."
  }
}

variable "helm_repositories" {
  description = "Helm repositories of the charts installed beside Firstlight (their URLs are in each project's installation guide): KubeRay's, Traefik's, NVIDIA's device plugin's, the Kubernetes Cluster Autoscaler's and AWS's EKS charts (the AWS Load Balancer Controller)."
  type = object({
    kuberay                      = string
    traefik                      = string
    nvidia_device_plugin         = string
    cluster_autoscaler           = string
    aws_load_balancer_controller = string
  })

  validation {
    condition     = alltrue([for url in values(var.helm_repositories) : can(regex("^(https|oci)://", url))])
    error_message = "Each Helm repository must be an https:// or oci:// URL."
  }
}

variable "chart_versions" {
  description = "Pinned versions of the charts installed beside Firstlight, and the Cluster Autoscaler's image tag, whose minor version must be the cluster's (kubernetes_version)."
  type = object({
    kuberay_operator             = string
    traefik                      = string
    nvidia_device_plugin         = string
    cluster_autoscaler           = string
    cluster_autoscaler_image     = string
    aws_load_balancer_controller = string
  })
  default = {
    kuberay_operator             = "1.5.1"
    traefik                      = "34.3.0"
    nvidia_device_plugin         = "0.19.0"
    cluster_autoscaler           = "9.50.0"
    cluster_autoscaler_image     = "v1.33.1"
    aws_load_balancer_controller = "1.13.0"
  }
}

variable "gpu_scale_down_unneeded_time" {
  description = "How long a GPU node may run without Ray workers before the Cluster Autoscaler removes it (down to gpu_node_group.min_size), as a duration (10m)."
  type        = string
  default     = "10m"

  validation {
    condition     = can(regex("^[0-9]+(s|m|h)$", var.gpu_scale_down_unneeded_time))
    error_message = "gpu_scale_down_unneeded_time must be a duration such as 10m, 600s or 1h."
  }
}
