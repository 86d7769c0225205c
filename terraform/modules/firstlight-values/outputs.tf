output "values" {
  description = "The chart's values for this region, as an object (yamlencode it for helm_release)."
  value       = local.values
}
