"""What lets a fleet scale and span clouds, read from the configuration (no provider
can be downloaded here, so nothing is planned): GPU nodes follow Ray's worker pods on
both clouds, with the taint the chart's workers tolerate; the AWS network load balancer
is the AWS Load Balancer Controller's; region-aws and region-gke share one Firstlight
contract; and latency DNS takes either cloud's load balancer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.terraform.terraform import REPO, TERRAFORM, literal, named, parse_dir

AWS = TERRAFORM / "modules/region-aws"
GKE = TERRAFORM / "modules/region-gke"
SHARED = ("firstlight_variables.tf", "firstlight_locals.tf", "values.tf")


def _resources(folder: Path, kind: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for block in parse_dir(folder).get("resource", []):
        for block_kind, body in block.items():
            if literal(block_kind) == kind:
                found.update(named([body]))
    return found


def _locals(folder: Path) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for block in parse_dir(folder).get("locals", []):
        merged.update(block)
    return merged


def _chart_worker_toleration() -> dict[str, str]:
    values = yaml.safe_load((REPO / "helm/firstlight/values.yaml").read_text(encoding="utf-8"))
    (toleration,) = values["rayCluster"]["workerGroups"][0]["tolerations"]
    return dict(toleration)


def _tolerated(taint_key: str, taint_effect: str) -> bool:
    """Whether the chart's worker toleration lets a pod onto a node with this taint."""
    toleration = _chart_worker_toleration()
    effect = {"NO_SCHEDULE": "NoSchedule"}.get(taint_effect, taint_effect)
    return (
        toleration["key"] == taint_key
        and toleration["operator"] == "Exists"
        and toleration["effect"] == effect
    )


# --- node autoscaling -------------------------------------------------------------------


def test_aws_gpu_nodes_scale_with_the_cluster_autoscaler_from_zero() -> None:
    """The hole: no node autoscaler, so Ray's autoscaler added GPU worker pods that
    stayed Pending. The Cluster Autoscaler runs with its own Pod Identity role, finds
    the node groups by the cluster's name, and the GPU group's Auto Scaling group
    carries the label, taint and GPU count its nodes will have (scale from zero)."""
    release = _resources(AWS, "helm_release")["cluster_autoscaler"]
    values = str(release["values"])
    assert "autoDiscovery" in values
    assert "module.eks.cluster_name" in values
    assert "local.cluster_autoscaler_service_account" in values
    identity = named(parse_dir(AWS)["module"])["cluster_autoscaler_identity"]
    assert identity["attach_cluster_autoscaler_policy"] is True
    association = identity["associations"]["this"]
    assert literal(association["service_account"]) == "${local.cluster_autoscaler_service_account}"
    assert "module.cluster_autoscaler_identity" in str(release["depends_on"])

    locals_ = _locals(AWS)
    taint = locals_["gpu_node_taint"]
    assert _tolerated(literal(taint["key"]), literal(taint["effect"]))
    # The node group's taint is that one...
    gpu_group = named(parse_dir(AWS)["module"])["eks"]["eks_managed_node_groups"]["gpu"]
    group_taint = gpu_group["taints"]["gpu"]
    assert literal(group_taint["key"]) == "${local.gpu_node_taint.key}"
    assert literal(group_taint["value"]) == "${local.gpu_node_taint.value}"
    assert literal(group_taint["effect"]) == "NO_SCHEDULE"
    # ...and the Auto Scaling group's node-template tags say so.
    tags = str(locals_["gpu_node_template_tags"])
    assert "k8s.io/cluster-autoscaler/node-template/taint/${local.gpu_node_taint.key}" in tags
    assert "k8s.io/cluster-autoscaler/node-template/label/${key}" in tags
    assert "node-template/resources/nvidia.com/gpu" in tags
    tag = _resources(AWS, "aws_autoscaling_group_tag")["gpu_node_template"]
    assert literal(tag["for_each"]) == "${local.gpu_node_template_tags}"
    assert 'eks_managed_node_groups["gpu"]' in literal(tag["autoscaling_group_name"])


def test_gke_gpu_pool_autoscales_with_the_taint_the_workers_tolerate() -> None:
    pools = _resources(GKE, "google_container_node_pool")
    gpu = pools["gpu"]
    (autoscaling,) = gpu["autoscaling"]
    assert literal(autoscaling["total_min_node_count"]) == "${var.gpu_node_group.min_size}"
    assert literal(autoscaling["total_max_node_count"]) == "${var.gpu_node_group.max_size}"
    (node_config,) = gpu["node_config"]
    (taint,) = node_config["taint"]
    assert _tolerated(literal(taint["key"]), literal(taint["effect"]))
    assert literal(node_config["labels"]) == "${local.gpu_node_labels}"
    (accelerator,) = node_config["guest_accelerator"]
    assert literal(accelerator["count"]) == "${var.gpu_node_group.gpus_per_node}"
    # The same bounds bound the chart's worker group (values.tf, shared).
    values_tf = (GKE / "values.tf").read_text(encoding="utf-8")
    assert "min_replicas = var.gpu_node_group.min_size" in values_tf
    assert "max_replicas = var.gpu_node_group.max_size" in values_tf


# --- the AWS load balancer ----------------------------------------------------------------


def test_the_nlb_is_the_load_balancer_controllers_with_ip_targets() -> None:
    """The hole: the NLB came from the in-tree provider's annotations (type nlb)."""
    releases = _resources(AWS, "helm_release")
    values = str(releases["ingress"]["values"])
    pairs = dict(re.findall(r'"(service\.beta\.kubernetes\.io/[\w.-]+)"\s*=\s*"([^"]*)"', values))
    assert pairs["service.beta.kubernetes.io/aws-load-balancer-type"] == "external"
    assert pairs["service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"] == "ip"
    assert pairs["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internet-facing"
    assert "nlb" not in pairs.values()
    # The controller is installed (with its Pod Identity role) before the Service, and
    # outlives it on destroy.
    assert "helm_release.aws_load_balancer_controller" in str(releases["ingress"]["depends_on"])
    controller = releases["aws_load_balancer_controller"]
    assert controller["wait"] is True
    assert "module.eks.cluster_name" in str(controller["values"])
    identity = named(parse_dir(AWS)["module"])["load_balancer_controller_identity"]
    assert identity["attach_aws_lb_controller_policy"] is True
    assert "module.load_balancer_controller_identity" in str(controller["depends_on"])


# --- one contract, two clouds -----------------------------------------------------------


def test_both_region_modules_share_the_firstlight_contract() -> None:
    """region-gke takes the Firstlight inputs, derives the names and builds the chart
    values from the very files region-aws does, and gives the same outputs that a
    fleet uses."""
    for name in SHARED:
        assert (GKE / name).is_symlink(), name
        assert (GKE / name).resolve() == (AWS / name).resolve(), name
    aws_outputs = set(named(parse_dir(AWS)["output"]))
    gke_outputs = set(named(parse_dir(GKE)["output"]))
    fleet = {
        "region_name",
        "public_hostname",
        "public_url",
        "cluster_name",
        "cluster_endpoint",
        "cluster_certificate_authority_data",
        "redis_endpoint",
        "dns_target",
        "chart_values",
    }
    assert fleet <= aws_outputs & gke_outputs
    aws_target = named(parse_dir(AWS)["output"])["dns_target"]["value"]
    gke_target = named(parse_dir(GKE)["output"])["dns_target"]["value"]
    assert set(aws_target) == set(gke_target)


def test_gke_api_endpoint_follows_the_same_cidr_rule() -> None:
    (cluster,) = _resources(GKE, "google_container_cluster").values()
    (private,) = cluster["private_cluster_config"]
    assert literal(private["enable_private_endpoint"]) == (
        "${length(var.endpoint_public_access_cidrs) == 0}"
    )
    assert private["enable_private_nodes"] is True
    (networks,) = cluster["master_authorized_networks_config"]
    assert "var.endpoint_public_access_cidrs" in str(networks["dynamic"])
    # Dataplane V2 enforces the chart's NetworkPolicies.
    assert literal(cluster["datapath_provider"]) == "ADVANCED_DATAPATH"


def test_gke_load_balancer_accepts_tls_1_2_and_up_only() -> None:
    (policy,) = _resources(GKE, "google_compute_ssl_policy").values()
    assert literal(policy["min_tls_version"]) == "TLS_1_2"
    manifests = _resources(GKE, "kubernetes_manifest")
    gateway_policy = manifests["gateway_tls_policy"]["manifest"]["spec"]
    assert "google_compute_ssl_policy.public.name" in str(gateway_policy["default"])


def test_latency_dns_takes_either_clouds_load_balancer() -> None:
    """An AWS region is an alias of its NLB; a GKE region an A record of its address,
    keyed for latency by the AWS region it names."""
    dns = TERRAFORM / "modules/latency-dns-aws"
    regions = named(parse_dir(dns)["variable"])["regions"]
    for field in ("latency_region", "load_balancer_hostname", "load_balancer_ip"):
        assert field in str(regions["type"])
    records = _resources(dns, "aws_route53_record")
    for record in records.values():
        assert "each.value.load_balancer_ip" in literal(record["records"])
        assert "alias" in str(record["dynamic"])
    example = parse_dir(TERRAFORM / "examples/aws-and-gcp")
    calls = named(example["module"])
    assert literal(calls["us_east"]["source"]) == "../../modules/region-aws"
    assert literal(calls["eu_central"]["source"]) == "../../modules/region-gke"
    assert literal(calls["eu_central"]["latency_region"]) == "eu-central-1"
    assert "region.dns_target" in literal(calls["dns"]["regions"])
