# AWS names derived from the inputs alone (no resources). The tests evaluate this file
# with the variables, firstlight_locals.tf and values.tf to check the chart values.

locals {
  tags = merge({ "firstlight/region" = var.region_name }, var.tags)
  # Traefik (platform.tf) is the region's entry: the chart renders an Ingress for it.
  gateway = null
}
