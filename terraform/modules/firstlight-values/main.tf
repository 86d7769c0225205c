# The Firstlight chart's values for one region, from typed inputs. Pure: no providers,
# no resources. TLS terminates at the load balancer in front of the cluster, so the
# Ingress (or, with a gateway, the HTTPRoute) serves plain HTTP (ingress.tls.enabled =
# false). extra_values is deep-merged over these (merge.tf).
locals {
  computed = {
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
    # The head and the gateway pods keep the chart's sizes (docs/deploy.md, "Sizing the
    # head and the gateway pods"); extra_values may set rayCluster.head or .gateways.
    rayCluster = {
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
    # The Ingress behind the region's ingress controller, or, with a gateway, an
    # HTTPRoute attached to it (the same host names either way).
    ingress = {
      enabled    = var.gateway == null
      className  = var.ingress_class_name
      host       = var.public_hostname
      extraHosts = local.extra_hosts
      tls        = { enabled = false }
    }
    httpRoute = {
      enabled    = var.gateway != null
      parentRefs = [for gateway in local.gateways : { name = gateway.name, namespace = gateway.namespace }]
      hostnames  = var.gateway == null ? [] : concat([var.public_hostname], local.extra_hosts)
    }
    monitoring = {
      serviceMonitor    = { enabled = var.monitoring_enabled }
      prometheusRule    = { enabled = var.monitoring_enabled }
      grafanaDashboards = { enabled = var.monitoring_enabled }
    }
  }
  extra_hosts = var.global_hostname == null ? [] : [var.global_hostname]
  gateways    = var.gateway == null ? [] : [var.gateway]
}
