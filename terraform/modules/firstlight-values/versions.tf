terraform {
  # No providers: this module only computes values, so it evaluates anywhere (the
  # tests apply it offline to check its output against the chart's values schema).
  required_version = ">= 1.5.7"
}
