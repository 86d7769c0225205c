# extra_values deep-merged over the computed values, the way Helm merges values files:
# objects merge key by key, anything else (lists, strings, numbers, null) in
# extra_values replaces what was there. A top-level merge() would drop every computed
# setting under a key that extra_values also sets (rayCluster = { head = ... } would
# lose the worker group); this keeps them.
#
# Terraform has no recursion, so the merge runs level by level to a fixed depth:
# merge_pairs_<n> holds, by path (a JSON list of keys), the places n levels down where
# both sides hold an object; merged_<n> merges each bottom-up, its children from
# merged_<n+1>. Objects are merged key by key down to level 6 (deeper than the computed
# values nest objects); a pair of objects below that is refused by the
# precondition on the "values" output rather than merged shallowly.

locals {
  merge_pairs_0 = { "[]" = { base = local.computed, extra = var.extra_values } }
  merge_pairs_1 = merge([for path, pair in local.merge_pairs_0 : {
    for key in keys(pair.extra) : jsonencode(concat(jsondecode(path), [key])) => { base = pair.base[key], extra = pair.extra[key] }
    if can(keys(pair.base[key])) && can(keys(pair.extra[key]))
  }]...)
  merge_pairs_2 = merge([for path, pair in local.merge_pairs_1 : {
    for key in keys(pair.extra) : jsonencode(concat(jsondecode(path), [key])) => { base = pair.base[key], extra = pair.extra[key] }
    if can(keys(pair.base[key])) && can(keys(pair.extra[key]))
  }]...)
  merge_pairs_3 = merge([for path, pair in local.merge_pairs_2 : {
    for key in keys(pair.extra) : jsonencode(concat(jsondecode(path), [key])) => { base = pair.base[key], extra = pair.extra[key] }
    if can(keys(pair.base[key])) && can(keys(pair.extra[key]))
  }]...)
  merge_pairs_4 = merge([for path, pair in local.merge_pairs_3 : {
    for key in keys(pair.extra) : jsonencode(concat(jsondecode(path), [key])) => { base = pair.base[key], extra = pair.extra[key] }
    if can(keys(pair.base[key])) && can(keys(pair.extra[key]))
  }]...)
  merge_pairs_5 = merge([for path, pair in local.merge_pairs_4 : {
    for key in keys(pair.extra) : jsonencode(concat(jsondecode(path), [key])) => { base = pair.base[key], extra = pair.extra[key] }
    if can(keys(pair.base[key])) && can(keys(pair.extra[key]))
  }]...)
  merge_pairs_6 = merge([for path, pair in local.merge_pairs_5 : {
    for key in keys(pair.extra) : jsonencode(concat(jsondecode(path), [key])) => { base = pair.base[key], extra = pair.extra[key] }
    if can(keys(pair.base[key])) && can(keys(pair.extra[key]))
  }]...)
  merge_pairs_7 = merge([for path, pair in local.merge_pairs_6 : {
    for key in keys(pair.extra) : jsonencode(concat(jsondecode(path), [key])) => { base = pair.base[key], extra = pair.extra[key] }
    if can(keys(pair.base[key])) && can(keys(pair.extra[key]))
  }]...)

  merged_6 = { for path, pair in local.merge_pairs_6 : path => merge(pair.base, pair.extra) }
  merged_5 = { for path, pair in local.merge_pairs_5 : path => merge(pair.base, pair.extra, {
    for key in keys(pair.extra) : key => local.merged_6[jsonencode(concat(jsondecode(path), [key]))]
    if contains(keys(local.merged_6), jsonencode(concat(jsondecode(path), [key])))
  }) }
  merged_4 = { for path, pair in local.merge_pairs_4 : path => merge(pair.base, pair.extra, {
    for key in keys(pair.extra) : key => local.merged_5[jsonencode(concat(jsondecode(path), [key]))]
    if contains(keys(local.merged_5), jsonencode(concat(jsondecode(path), [key])))
  }) }
  merged_3 = { for path, pair in local.merge_pairs_3 : path => merge(pair.base, pair.extra, {
    for key in keys(pair.extra) : key => local.merged_4[jsonencode(concat(jsondecode(path), [key]))]
    if contains(keys(local.merged_4), jsonencode(concat(jsondecode(path), [key])))
  }) }
  merged_2 = { for path, pair in local.merge_pairs_2 : path => merge(pair.base, pair.extra, {
    for key in keys(pair.extra) : key => local.merged_3[jsonencode(concat(jsondecode(path), [key]))]
    if contains(keys(local.merged_3), jsonencode(concat(jsondecode(path), [key])))
  }) }
  merged_1 = { for path, pair in local.merge_pairs_1 : path => merge(pair.base, pair.extra, {
    for key in keys(pair.extra) : key => local.merged_2[jsonencode(concat(jsondecode(path), [key]))]
    if contains(keys(local.merged_2), jsonencode(concat(jsondecode(path), [key])))
  }) }
  merged_0 = { for path, pair in local.merge_pairs_0 : path => merge(pair.base, pair.extra, {
    for key in keys(pair.extra) : key => local.merged_1[jsonencode(concat(jsondecode(path), [key]))]
    if contains(keys(local.merged_1), jsonencode(concat(jsondecode(path), [key])))
  }) }

  values = local.merged_0["[]"]
  # Objects on both sides deeper than merged_6 reaches (refused by outputs.tf).
  unmerged_paths = keys(local.merge_pairs_7)
}
