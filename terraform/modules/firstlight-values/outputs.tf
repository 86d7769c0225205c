output "values" {
  description = "The chart's values for this region, as an object (yamlencode it for helm_release): the computed values with extra_values deep-merged over them."
  value       = local.values

  precondition {
    condition     = length(local.unmerged_paths) == 0
    error_message = "extra_values nests objects deeper than the merge reaches, where the computed values also hold objects (at ${join(", ", local.unmerged_paths)}): set that subtree whole at a shallower key, or deepen merge.tf."
  }
}
