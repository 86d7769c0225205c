# One Firstlight region on Google Cloud: a regional GKE cluster with a system and a GPU
# node pool, both scaled by GKE's cluster autoscaler; a Memorystore Redis for
# prefix-cache hints (redis.tf); a Google-managed certificate for the region's names
# (tls.tf); GKE's Gateway in front of the chart's HTTPRoute (gateway.tf); the KubeRay
# operator and the Firstlight chart (platform.tf) with values from values.tf, the same
# file region-aws uses.
#
# Providers come from the caller (google; aws for the certificate's records in the
# fleet's Route 53 zone; kubernetes/helm configured from this module's cluster
# outputs), so regions on both clouds can live in one configuration.

# The nodes' own service account, with only what nodes need (logs, metrics, image
# pulls), instead of the project's default Compute Engine account (Editor).
resource "google_service_account" "nodes" {
  project      = var.project_id
  account_id   = substr("${local.cluster_name}-nodes", 0, 30)
  display_name = "Firstlight ${var.region_name} GKE nodes"
}

resource "google_project_iam_member" "nodes" {
  for_each = toset([
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/stackdriver.resourceMetadata.writer",
    "roles/artifactregistry.reader",
  ])

  project = var.project_id
  role    = each.value
  member  = "serviceAccount:${google_service_account.nodes.email}"
}

resource "google_container_cluster" "this" {
  #checkov:skip=CKV_GCP_12:Dataplane V2 (datapath_provider ADVANCED_DATAPATH below) enforces NetworkPolicies; the network_policy block this check reads is Calico's, which GKE refuses alongside Dataplane V2.
  #checkov:skip=CKV_GCP_69:The default node pool is removed at creation; both node pools (system, gpu) run the GKE metadata server (workload_metadata_config GKE_METADATA).
  #checkov:skip=CKV_GCP_21:resource_labels is set (local.labels: the region's label and the caller's); checkov does not resolve that merge when the module is called from an example.
  #checkov:skip=CKV_GCP_65:Kubernetes RBAC through Google Groups needs a gke-security-groups group in the organisation's Workspace domain, which this module cannot assume; access is granted with IAM roles on the project.
  project  = var.project_id
  name     = local.cluster_name
  location = var.gcp_region

  min_master_version = var.kubernetes_version
  release_channel {
    channel = "REGULAR"
  }

  # Node pools are managed below; GKE needs a default pool at creation only.
  remove_default_node_pool = true
  initial_node_count       = 1
  deletion_protection      = true

  network         = var.network
  subnetwork      = var.subnetwork
  networking_mode = "VPC_NATIVE"
  ip_allocation_policy {
    cluster_secondary_range_name  = var.pods_range_name
    services_secondary_range_name = var.services_range_name
  }

  # Dataplane V2 enforces NetworkPolicies (the chart's keep Ray's ports and Redis to
  # the release's own pods).
  datapath_provider = "ADVANCED_DATAPATH"

  # Private nodes; the control plane's public endpoint only for the caller's CIDRs, and
  # none at all for [] (the same contract as region-aws).
  private_cluster_config {
    enable_private_nodes    = true
    enable_private_endpoint = length(var.endpoint_public_access_cidrs) == 0
    master_ipv4_cidr_block  = var.master_ipv4_cidr_block
  }
  master_authorized_networks_config {
    dynamic "cidr_blocks" {
      for_each = var.endpoint_public_access_cidrs
      content {
        cidr_block   = cidr_blocks.value
        display_name = "operators-${cidr_blocks.key}"
      }
    }
  }

  workload_identity_config {
    workload_pool = "${var.project_id}.svc.id.goog"
  }
  gateway_api_config {
    channel = "CHANNEL_STANDARD"
  }

  enable_shielded_nodes       = true
  enable_intranode_visibility = true
  enable_legacy_abac          = false
  master_auth {
    client_certificate_config {
      issue_client_certificate = false
    }
  }
  binary_authorization {
    evaluation_mode = "PROJECT_SINGLETON_POLICY_ENFORCE"
  }

  resource_labels = local.labels
}

locals {
  node_config = {
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    metadata        = { disable-legacy-endpoints = "true" }
  }
}

resource "google_container_node_pool" "system" {
  project  = var.project_id
  name     = "system"
  cluster  = google_container_cluster.this.id
  location = var.gcp_region

  autoscaling {
    total_min_node_count = var.system_node_group.min_size
    total_max_node_count = var.system_node_group.max_size
  }
  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type    = var.system_node_group.machine_type
    image_type      = "COS_CONTAINERD"
    labels          = { "firstlight/pool" = "system" }
    resource_labels = local.labels
    service_account = local.node_config.service_account
    oauth_scopes    = local.node_config.oauth_scopes
    metadata        = local.node_config.metadata
    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
  }
}

# The GPU pool: GKE installs the NVIDIA driver and device plugin itself. Its cluster
# autoscaler adds a node for each Ray GPU worker pod no node can take (Ray's autoscaler
# adds those pods when Serve needs replicas) and removes idle ones, within the pool's
# bounds, which also bound the chart's worker group.
resource "google_container_node_pool" "gpu" {
  project        = var.project_id
  name           = "gpu"
  cluster        = google_container_cluster.this.id
  location       = var.gcp_region
  node_locations = length(var.gpu_node_group.zones) > 0 ? var.gpu_node_group.zones : null

  autoscaling {
    total_min_node_count = var.gpu_node_group.min_size
    total_max_node_count = var.gpu_node_group.max_size
    location_policy      = "ANY"
  }
  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type    = var.gpu_node_group.machine_type
    image_type      = "COS_CONTAINERD"
    disk_size_gb    = var.gpu_node_group.disk_size_gib
    labels          = local.gpu_node_labels
    resource_labels = local.labels
    service_account = local.node_config.service_account
    oauth_scopes    = local.node_config.oauth_scopes
    metadata        = local.node_config.metadata

    guest_accelerator {
      type  = var.gpu_node_group.accelerator_type
      count = var.gpu_node_group.gpus_per_node
      gpu_driver_installation_config {
        gpu_driver_version = "LATEST"
      }
    }
    # Only pods that tolerate it (the Ray workers) land on GPUs; the chart's worker
    # group tolerates nvidia.com/gpu with any value.
    taint {
      key    = "nvidia.com/gpu"
      value  = "present"
      effect = "NO_SCHEDULE"
    }

    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
  }
}
