variable "domain" {
  description = "DNS domain of the deployment (llm.example.com), a Route 53 hosted zone of the AWS account: clients use it, regions are <region>.<domain>."
  type        = string

  validation {
    condition     = can(regex("^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\\.)+[a-z]{2,63}$", var.domain))
    error_message = "domain must be a lowercase DNS name such as llm.example.com."
  }
}

variable "gcp_project_id" {
  description = "Google Cloud project of the GKE region (with the Container, Redis, Certificate Manager, Compute and Service Networking APIs enabled)."
  type        = string
}

variable "hash_seed" {
  description = "The block-hash seed shared by both regions (every pod's PYTHONHASHSEED); change it only in both at once."
  type        = number
  default     = 1729

  validation {
    condition     = var.hash_seed >= 0 && var.hash_seed <= 4294967295 && floor(var.hash_seed) == var.hash_seed
    error_message = "hash_seed must be an integer between 0 and 4294967295."
  }
}

variable "image" {
  description = "Firstlight's container image in a registry both clouds' nodes can pull from."
  type = object({
    repository = string
    tag        = string
  })
}

variable "helm_repositories" {
  description = "Helm repository URLs of KubeRay, Traefik, NVIDIA's device plugin, the Cluster Autoscaler and AWS's EKS charts (from each project's installation guide); the GKE region uses KubeRay's only."
  type = object({
    kuberay                      = string
    traefik                      = string
    nvidia_device_plugin         = string
    cluster_autoscaler           = string
    aws_load_balancer_controller = string
  })
}

variable "endpoint_public_access_cidrs" {
  description = "CIDR blocks allowed to reach both clusters' Kubernetes API (where Terraform and operators run); [] keeps the APIs private (reachable from each region's network only)."
  type        = list(string)

  validation {
    condition     = alltrue([for c in var.endpoint_public_access_cidrs : can(cidrhost(c, 0))])
    error_message = "endpoint_public_access_cidrs must be CIDR blocks (203.0.113.0/24); [] for private endpoints only."
  }
}

variable "gpu_nodes_min" {
  description = "Fewest GPU nodes per region; 0 lets an idle region scale its GPUs to zero (the first request then waits for a node)."
  type        = number
  default     = 1

  validation {
    condition     = var.gpu_nodes_min >= 0
    error_message = "gpu_nodes_min cannot be negative."
  }
}
