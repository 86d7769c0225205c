"""The chart values the region modules give, evaluated by Terraform offline from each
module's own variables, locals and values.tf (the same file in both: region-aws holds
it, region-gke links to it), pass the chart's schema and render; and extra_values is
deep-merged into them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.chart.chart import render
from tests.terraform.terraform import (
    TERRAFORM,
    literal,
    named,
    parse_dir,
    scratch_copy,
    terraform,
)

VALUES_FILES = ("variables.tf", "firstlight_variables.tf", "locals.tf", "firstlight_locals.tf")


def region_values(tmp_path: Path, module: str, tfvars: dict[str, Any]) -> dict[str, Any]:
    """The chart values a region module gives, evaluated by Terraform from the module's
    variables, locals and values.tf (the Redis URL, a resource attribute, stubbed)."""
    source = TERRAFORM / "modules" / module
    root = tmp_path / f"{module}-values"
    root.mkdir(parents=True)
    for name in VALUES_FILES:
        shutil.copy(source / name, root / name)
    values_tf = (source / "values.tf").read_text(encoding="utf-8")
    (root / "values.tf").write_text(
        values_tf.replace(
            '"../firstlight-values"', json.dumps(str(TERRAFORM / "modules/firstlight-values"))
        )
    )
    (root / "stub.tf").write_text(
        'locals {\n  redis_url = "rediss://master.hints.example.internal:6379/0"\n}\n'
        'output "values" {\n  value = module.values.values\n}\n'
    )
    (root / "terraform.tfvars.json").write_text(json.dumps(tfvars))
    init = terraform(root, "init", backend=False, input=False)
    assert init.retcode == 0, init.stderr
    apply = terraform(root, "apply", auto_approve=True, input=False)
    assert apply.retcode == 0, apply.stderr
    output = terraform(root, "output", json=True)
    values: dict[str, Any] = json.loads(output.stdout)["values"]["value"]
    return values


REQUIRED_INPUTS = {
    "region_name": "us-east",
    "domain": "llm.example.com",
    "zone_id": "Z0000000000000EXAMPLE",
    "vpc_id": "vpc-0123456789abcdef0",
    "private_subnet_ids": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
    "image": {"repository": "registry.example.com/firstlight/firstlight", "tag": "0.1.0"},
    "endpoint_public_access_cidrs": ["203.0.113.0/24"],
    "helm_repositories": {
        "kuberay": "https://charts.example.com/kuberay",
        "traefik": "https://charts.example.com/traefik",
        "nvidia_device_plugin": "https://charts.example.com/nvidia",
        "cluster_autoscaler": "https://charts.example.com/autoscaler",
        "aws_load_balancer_controller": "https://charts.example.com/eks",
    },
}

GKE_REQUIRED_INPUTS = {
    **{k: v for k, v in REQUIRED_INPUTS.items() if k not in {"vpc_id", "private_subnet_ids"}},
    "region_name": "eu-central",
    "project_id": "firstlight-example",
    "gcp_region": "europe-west3",
    "latency_region": "eu-central-1",
    "network": "firstlight-eu-central",
    "subnetwork": "firstlight-eu-central-nodes",
    "pods_range_name": "pods",
    "services_range_name": "services",
}
"""region-gke's required inputs; its helm_repositories is region-aws's object, of which
it takes KubeRay's only (the conversion drops the rest)."""


def test_region_module_values_pass_the_chart_schema(tmp_path: Path) -> None:
    variables = named(parse_dir(TERRAFORM / "modules/region-aws")["variable"])
    assert {v for v, spec in variables.items() if "default" not in spec} == set(REQUIRED_INPUTS)
    values = region_values(
        tmp_path,
        "region-aws",
        {**REQUIRED_INPUTS, "peers": [{"region": "eu-west", "rtt_ms": 75}]},
    )
    rendered = render(values)  # validates against values.schema.json first
    config = yaml.safe_load(rendered.one("RayService")["spec"]["serveConfigV2"])
    args = config["applications"][0]["args"]
    assert args["config"]["regions"][0]["peers"] == [
        {"region": "eu-west", "url": "https://eu-west.llm.example.com", "rtt_ms": 75}
    ]
    assert args["config"]["hints"]["redis_url"] == "rediss://master.hints.example.internal:6379/0"
    ingress = rendered.one("Ingress")
    assert [r["host"] for r in ingress["spec"]["rules"]] == [
        "us-east.llm.example.com",
        "llm.example.com",
    ]
    assert rendered.of_kind("HTTPRoute") == []
    groups = rendered.one("RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    group = next(g for g in groups if g["groupName"] == "gpu")
    assert group["template"]["spec"]["nodeSelector"] == {"firstlight/pool": "gpu"}
    # The API keys are a reference to a Secret made outside Terraform, never values.
    assert values["auth"]["apiKeys"] == {
        "existingSecret": "firstlight-api-keys",
        "keys": ["api-key-0"],
    }


def test_gke_region_values_pass_the_chart_schema_with_an_httproute(tmp_path: Path) -> None:
    """The GKE region's entry is GKE's Gateway: the chart renders an HTTPRoute attached
    to it for both names, and no Ingress; the rest is built by the same values.tf."""
    variables = named(parse_dir(TERRAFORM / "modules/region-gke")["variable"])
    required = {v for v, spec in variables.items() if "default" not in spec}
    assert required == set(GKE_REQUIRED_INPUTS)
    values = region_values(
        tmp_path,
        "region-gke",
        {**GKE_REQUIRED_INPUTS, "peers": [{"region": "us-east", "rtt_ms": 90}]},
    )
    rendered = render(values)
    assert rendered.of_kind("Ingress") == []
    route = rendered.one("HTTPRoute")["spec"]
    assert route["parentRefs"] == [{"name": "firstlight", "namespace": "firstlight"}]
    assert route["hostnames"] == ["eu-central.llm.example.com", "llm.example.com"]
    config = yaml.safe_load(rendered.one("RayService")["spec"]["serveConfigV2"])
    assert config["applications"][0]["args"]["config"]["regions"][0]["peers"] == [
        {"region": "us-east", "url": "https://us-east.llm.example.com", "rtt_ms": 90}
    ]
    groups = rendered.one("RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    group = next(g for g in groups if g["groupName"] == "gpu")
    assert group["template"]["spec"]["nodeSelector"] == {"firstlight/pool": "gpu"}
    # The gateway's backend is the Service the GKE policies (gateway.tf) target.
    backend = route["rules"][0]["backendRefs"][0]
    locals_ = parse_dir(TERRAFORM / "modules/region-gke")["locals"]
    serve_service = next(literal(b["serve_service"]) for b in locals_ if "serve_service" in b)
    assert backend == {"name": serve_service, "port": 8000}


def test_extra_values_are_deep_merged(tmp_path: Path) -> None:
    """The hole: extra_values was merged at the top level only, so setting one nested
    value dropped every computed setting beside it (here the peer Secret's name beside
    its key, the GPU worker group beside the gateway pods under rayCluster, and the
    Ingress's hosts)."""
    extra: dict[str, Any] = {
        "auth": {"peerSecret": {"key": "hop-key"}},
        "rayCluster": {"gateways": {"sizing": {"memoryPerGatewayMi": 2048}}},
        "ingress": {"annotations": {"traefik.ingress.kubernetes.io/router.priority": "10"}},
        "router": {"spill_over": {"enabled": False}},
    }
    values = region_values(tmp_path, "region-aws", {**REQUIRED_INPUTS, "extra_values": extra})
    peer = values["auth"]["peerSecret"]
    assert peer["key"] == "hop-key"  # the nested setting...
    assert peer["existingSecret"] == ""  # ...beside the module's own (no peers: none)
    assert values["rayCluster"]["gateways"] == extra["rayCluster"]["gateways"]
    assert values["rayCluster"]["workerGroups"][0]["name"] == "gpu"
    assert values["ingress"]["host"] == "us-east.llm.example.com"
    assert values["ingress"]["annotations"] == extra["ingress"]["annotations"]
    assert values["router"] == extra["router"]
    # Lists are replaced whole, as Helm does with values files.
    replaced = region_values(
        tmp_path / "lists",
        "region-aws",
        {**REQUIRED_INPUTS, "extra_values": {"ingress": {"extraHosts": []}}},
    )
    assert replaced["ingress"]["extraHosts"] == []
    assert replaced["ingress"]["className"] == "traefik"


def test_a_merge_deeper_than_supported_is_refused_not_flattened(tmp_path: Path) -> None:
    """Below merge.tf's last level a pair of objects would be merged shallowly; the
    module refuses it instead. (The computed values nest too shallowly to reach it, so a
    copy gets a deeper one.)"""
    copy = scratch_copy(tmp_path) / "modules/firstlight-values"
    main = copy / "main.tf"
    deep = "hints = {\n      deep = { a = { b = { c = { d = { e = { f = { kept = 1 } } } } } } }"
    main.write_text(main.read_text().replace("hints = {", deep, 1))
    (copy / "root.tf").write_text(
        'output "root" {\n  value = local.values.hints\n}\n'
        'variable "more" {\n  type    = any\n  default = {}\n}\n'
    )
    (copy / "terraform.tfvars.json").write_text(
        json.dumps(
            {
                "region_name": "us-east",
                "public_hostname": "us-east.llm.example.com",
                "models": [],
                "image": {"repository": "r", "tag": "t"},
                "gpu_worker_group": {
                    "gpus": 1,
                    "min_replicas": 1,
                    "max_replicas": 1,
                    "cpu": "1",
                    "memory": "1Gi",
                },
                "redis_url": "redis://r:6379/0",
                "redis_secret_name": "s",
                "api_keys_secret_name": "k",
                "api_key_names": ["api-key-0"],
                "extra_values": {
                    "hints": {"deep": {"a": {"b": {"c": {"d": {"e": {"f": {"new": 2}}}}}}}}
                },
            }
        )
    )
    assert terraform(copy, "init", backend=False, input=False).retcode == 0
    apply = terraform(copy, "apply", auto_approve=True, input=False)
    assert apply.retcode != 0
    assert "extra_values nests objects deeper than the merge reaches" in apply.stderr
    assert '["hints","deep","a","b","c","d","e"]' in apply.stderr.replace("\n", "")
