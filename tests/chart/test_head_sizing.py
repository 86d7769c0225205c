"""The head pod (``rayCluster.head``): every gateway replica runs on it, and its CPU request
is computed from ``gateway.replicas`` unless the operator sets ``resources``.

The sizing is held to the stored serving benchmark
(``docs/benchmarks/serving-haproxy/results.json``, ``capacity.by_gateways``): the fixed
part must cover what Ray's core, Serve's controller and proxy and HAProxy used at the
measured capacity, and the part per gateway what one gateway used there. No figure is
typed here: lowering a default below the measurement, or a new measurement above the
defaults, fails :func:`test_default_sizing_covers_what_the_benchmark_measured`.
"""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest
from ray.autoscaler._private.kuberay.autoscaling_config import _get_custom_resources

from firstlight.config import GatewayConfig
from firstlight.serve.app import build_app
from firstlight.serve.placement import GATEWAY_RESOURCE, GATEWAY_RESOURCE_PER_REPLICA
from firstlight_bench.tools.cpu_share import GROUPS
from tests.chart.chart import CHART_DIR, REPO, app_args, load_values, render

DEFAULTS = load_values(CHART_DIR / "values.yaml")
SIZING: dict[str, Any] = DEFAULTS["rayCluster"]["head"]["sizing"]
BENCHMARK = REPO / "docs" / "benchmarks" / "serving-haproxy" / "results.json"

FIXED_GROUPS = ("ray core", "serve controller and proxy", "haproxy")
"""The benchmark's process groups (``firstlight_bench.tools.cpu_share``) that run on the
head whatever the gateway count; ``gateways`` is the group each replica adds."""
GATEWAY_GROUP = "gateways"


def _cluster(values: dict[str, Any]) -> dict[str, Any]:
    cluster: dict[str, Any] = render(values).one("RayService")["spec"]["rayClusterConfig"]
    return cluster


def _head_resources(values: dict[str, Any]) -> dict[str, Any]:
    (container,) = _cluster(values)["headGroupSpec"]["template"]["spec"]["containers"]
    resources: dict[str, Any] = container["resources"]
    return resources


def _millicores(quantity: str) -> int:
    """A Kubernetes CPU quantity as the chart writes it (``"3"`` or ``"3500m"``)."""
    return int(quantity[:-1]) if quantity.endswith("m") else int(quantity) * 1000


def _measured_cores() -> tuple[float, float]:
    """(fixed, per gateway): the largest over the benchmark's gateway counts of the fixed
    groups' cores, and of the gateway group's cores divided by the gateway count."""
    capacity: dict[str, Any] = json.loads(BENCHMARK.read_text(encoding="utf-8"))["capacity"]
    levels = capacity["by_gateways"]
    assert levels, "the stored benchmark has no capacity levels"
    fixed = max(sum(level["cores"][g] for g in FIXED_GROUPS) for level in levels.values())
    per_gateway = max(level["cores"][GATEWAY_GROUP] / int(n) for n, level in levels.items())
    return fixed, per_gateway


def test_the_measurement_is_of_the_charts_data_plane_and_groups() -> None:
    meta = json.loads(BENCHMARK.read_text(encoding="utf-8"))["meta"]
    assert meta["ingress"] == DEFAULTS["gateway"]["ingress"]
    assert set(FIXED_GROUPS) | {GATEWAY_GROUP} <= set(GROUPS)


def test_default_sizing_covers_what_the_benchmark_measured() -> None:
    fixed, per_gateway = _measured_cores()
    assert SIZING["fixedCpuMillis"] >= 1000 * fixed, (SIZING, fixed)
    assert SIZING["cpuPerGatewayMillis"] >= 1000 * per_gateway, (SIZING, per_gateway)
    replicas = DEFAULTS["gateway"]["replicas"]
    cpu = _millicores(_head_resources({})["requests"]["cpu"])
    assert cpu >= 1000 * (fixed + replicas * per_gateway)


@pytest.mark.parametrize("replicas", [2, 4])
def test_the_head_is_computed_from_the_gateway_replicas(replicas: int) -> None:
    resources = _head_resources({"gateway": {"replicas": replicas}})
    wanted = SIZING["fixedCpuMillis"] + replicas * SIZING["cpuPerGatewayMillis"]
    assert _millicores(resources["requests"]["cpu"]) == wanted
    assert "cpu" not in resources["limits"]  # no CFS throttling of the request path
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == SIZING["memory"]


def test_a_part_core_is_written_in_millicores() -> None:
    sizing = {**SIZING, "fixedCpuMillis": 500}
    values = {"gateway": {"replicas": 3}, "rayCluster": {"head": {"sizing": sizing}}}
    cpu = _head_resources(values)["requests"]["cpu"]
    assert cpu == f"{500 + 3 * SIZING['cpuPerGatewayMillis']}m"


def test_resources_set_by_the_operator_are_used_as_they_are() -> None:
    mine = {"requests": {"cpu": "7", "memory": "20Gi"}, "limits": {"cpu": "7", "memory": "20Gi"}}
    values = {"gateway": {"replicas": 4}, "rayCluster": {"head": {"resources": mine}}}
    assert _head_resources(values) == mine


def test_only_the_head_advertises_the_gateway_resource_with_room_for_every_gateway() -> None:
    cluster = _cluster({})
    head = _get_custom_resources({}, cluster["headGroupSpec"]["rayStartParams"], "head")
    assert head == {GATEWAY_RESOURCE: 1}
    for group in cluster["workerGroupSpecs"]:
        assert "resources" not in group["rayStartParams"], group["groupName"]
    most = GatewayConfig.model_json_schema()["properties"]["replicas"]["maximum"]
    assert 2 * most * GATEWAY_RESOURCE_PER_REPLICA <= head[GATEWAY_RESOURCE]


def test_the_rendered_application_pins_its_gateways_to_the_head() -> None:
    gateway = build_app(app_args(render({})))._bound_deployment
    assert gateway.name == "gateway"
    assert gateway.ray_actor_options == {
        "num_cpus": 0,
        "resources": {GATEWAY_RESOURCE: GATEWAY_RESOURCE_PER_REPLICA},
    }


@pytest.mark.parametrize(
    ("sizing", "field"),
    [
        ({"fixedCpuMillis": 0}, "fixedCpuMillis"),
        ({"cpuPerGatewayMillis": "1"}, "cpuPerGatewayMillis"),
        ({"memory": "8GB"}, "memory"),
    ],
)
def test_bad_sizing_is_refused_naming_the_field(sizing: dict[str, Any], field: str) -> None:
    values = json.loads(json.dumps(DEFAULTS))
    values["rayCluster"]["head"]["sizing"].update(sizing)
    with helm.Chart.load(str(CHART_DIR)) as chart, pytest.raises(helm.HelmValuesError) as info:
        chart.validate_schema(values)
    assert f"/rayCluster/head/sizing/{field}" in str(info.value)
