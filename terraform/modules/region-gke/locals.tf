# GCP names derived from the inputs alone (no resources). The tests evaluate this file
# with the variables, firstlight_locals.tf and values.tf to check the chart values.

locals {
  # GCP label keys take no "/" or ".": the region under a plain key.
  labels = merge({ "firstlight-region" = var.region_name }, var.labels)
  # GKE's Gateway controller (gateway.tf) is the region's entry: the chart renders an
  # HTTPRoute attached to this Gateway instead of an Ingress.
  gateway = { name = "firstlight", namespace = var.namespace }
}
