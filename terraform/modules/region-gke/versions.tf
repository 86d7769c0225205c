# aws: the fleet's DNS is Route 53 (latency-dns-aws), where the certificate's DNS
# authorization records go.
terraform {
  required_version = ">= 1.5.7"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.30, < 8.0"
    }
    aws = {
      source  = "hashicorp/aws"
      version = ">= 6.15, < 7.0"
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = ">= 2.38, < 4.0"
    }
    helm = {
      source  = "hashicorp/helm"
      version = ">= 3.0, < 4.0"
    }
  }
}
