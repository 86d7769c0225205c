terraform {
  required_version = ">= 1.11"

  # The state holds the ElastiCache token and the Memorystore AUTH string: keep it in
  # S3, encrypted with a KMS key only the deployers may use, locked by an S3 lock file
  # (backend.hcl from backend.hcl.example: `terraform init -backend-config=backend.hcl`).
  backend "s3" {
    encrypt      = true
    use_lockfile = true
  }

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 6.15, < 7.0"
    }
    google = {
      source  = "hashicorp/google"
      version = ">= 6.30, < 8.0"
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = ">= 2.38, < 4.0"
    }
    helm = {
      source  = "hashicorp/helm"
      version = ">= 3.0, < 4.0"
    }
    random = {
      source  = "hashicorp/random"
      version = ">= 3.6, < 4.0"
    }
  }
}
