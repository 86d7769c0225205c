output "network" {
  description = "The network's self link (after private service access is in place)."
  value       = google_service_networking_connection.services.network
}

output "subnetwork" {
  description = "The nodes' subnetwork self link."
  value       = google_compute_subnetwork.nodes.self_link
}

output "pods_range_name" {
  description = "Name of the secondary range for pod IPs."
  value       = google_compute_subnetwork.nodes.secondary_ip_range[0].range_name
}

output "services_range_name" {
  description = "Name of the secondary range for Service IPs."
  value       = google_compute_subnetwork.nodes.secondary_ip_range[1].range_name
}
