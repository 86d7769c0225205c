# The Firstlight chart's values for one region, from typed inputs. Pure: no providers,
# no resources. TLS terminates at the network load balancer in front of the ingress
# controller, so the Ingress itself serves plain HTTP (ingress.tls.enabled = false).
locals {
  values = merge({
    region = {
      name  = var.region_name
      peers = var.peers
    }
    models = var.models
    hints = {
      hash_seed = var.hash_seed
    }
    auth = {
      enabled = true
      apiKeys = {
        existingSecret = var.api_keys_secret_name
        keys           = var.api_key_names
      }
      # The regions' shared hop key; needed only by a region with peers.
      peerSecret = {
        existingSecret = length(var.peers) > 0 ? var.peer_secret_name : ""
        key            = "peer-secret"
      }
    }
    image = {
      repository = var.image.repository
      tag        = var.image.tag
    }
    rayCluster = {
      head = {
        resources = {
          requests = { cpu = "2", memory = "8Gi" }
          limits   = { cpu = "2", memory = "8Gi" }
        }
      }
      workerGroups = [{
        name         = "gpu"
        replicas     = var.gpu_worker_group.min_replicas
        minReplicas  = var.gpu_worker_group.min_replicas
        maxReplicas  = var.gpu_worker_group.max_replicas
        gpus         = var.gpu_worker_group.gpus
        nodeSelector = var.gpu_node_selector
        tolerations  = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]
        resources = {
          requests = { cpu = var.gpu_worker_group.cpu, memory = var.gpu_worker_group.memory }
          limits   = { cpu = var.gpu_worker_group.cpu, memory = var.gpu_worker_group.memory }
        }
      }]
    }
    redis = {
      enabled = false
    }
    externalRedis = {
      url            = var.redis_url
      existingSecret = var.redis_secret_name
      passwordKey    = "password"
    }
    ingress = {
      enabled    = true
      className  = var.ingress_class_name
      host       = var.public_hostname
      extraHosts = var.global_hostname == null ? [] : [var.global_hostname]
      tls        = { enabled = false }
    }
    monitoring = {
      serviceMonitor    = { enabled = var.monitoring_enabled }
      prometheusRule    = { enabled = var.monitoring_enabled }
      grafanaDashboards = { enabled = var.monitoring_enabled }
    }
  }, var.extra_values)
}
