"""The head and the gateway pods (``rayCluster.head``, ``rayCluster.gateways``): what each
runs, how big each is, and what a change of ``gateway.replicas`` changes.

The head runs no gateway and has a fixed size; the gateway pods (a CPU-only worker group
listed first) run every gateway replica, each pod sized for ``gatewaysPerPod`` gateways.
Both sizes are held to the stored serving benchmark
(``docs/benchmarks/serving-haproxy/results.json``, ``capacity.by_gateways``): the head's
CPU request and a gateway pod's fixed part must cover what Ray's core, Serve's
controller and proxy and HAProxy used at the measured capacity, the part per gateway
what one gateway used there. No figure is typed here: lowering a default below the
measurement, or a new measurement above the defaults, fails
:func:`test_default_sizes_cover_what_the_benchmark_measured`.

Where the gateways can land is checked with Ray's own autoscaler code on the rendered
cluster: the node types it derives from the RayService (KubeRay's autoscaler sidecar
runs the same) and the node types it would start for the gateways' resource demand.
"""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import (
    _default_utilization_scorer,
    get_nodes_for,
)

from firstlight.serve.app import build_app
from firstlight.serve.placement import GATEWAY_RESOURCE, GATEWAY_RESOURCE_PER_REPLICA
from firstlight_bench.tools.cpu_share import GROUPS
from tests.chart.chart import CHART_DIR, REPO, app_args, crd_validator, load_values, render

DEFAULTS = load_values(CHART_DIR / "values.yaml")
HEAD: dict[str, Any] = DEFAULTS["rayCluster"]["head"]
GATEWAYS: dict[str, Any] = DEFAULTS["rayCluster"]["gateways"]
SIZING: dict[str, Any] = GATEWAYS["sizing"]
BENCHMARK = REPO / "docs" / "benchmarks" / "serving-haproxy" / "results.json"

FIXED_GROUPS = ("ray core", "serve controller and proxy", "haproxy")
"""The benchmark's process groups (``firstlight_bench.tools.cpu_share``) that run whatever
the gateway count: on the head (Ray's core with the GCS, the Serve controller) and on
each gateway pod (its raylet and agents, Serve's proxy and HAProxy); ``gateways`` is the
group each gateway replica adds."""
GATEWAY_GROUP = "gateways"


def _values(replicas: int, per_pod: int = 1) -> dict[str, Any]:
    return {
        "gateway": {"replicas": replicas},
        "rayCluster": {"gateways": {"gatewaysPerPod": per_pod}},
    }


def _cluster(values: dict[str, Any]) -> dict[str, Any]:
    cluster: dict[str, Any] = render(values).one("RayService")["spec"]["rayClusterConfig"]
    return cluster


def _gateway_group(cluster: dict[str, Any]) -> dict[str, Any]:
    group: dict[str, Any] = cluster["workerGroupSpecs"][0]
    assert group["groupName"] == "gateways"
    return group


def _resources(group: dict[str, Any]) -> dict[str, Any]:
    (container,) = group["template"]["spec"]["containers"]
    resources: dict[str, Any] = container["resources"]
    return resources


def _millicores(quantity: str) -> int:
    """A Kubernetes CPU quantity as the chart writes it (``"3"`` or ``"3500m"``)."""
    return int(quantity[:-1]) if quantity.endswith("m") else int(quantity) * 1000


def _node_types(cluster: dict[str, Any]) -> dict[str, Any]:
    """The node types Ray's KubeRay autoscaler derives from the rendered cluster."""
    ray_cr = {"metadata": {"name": "firstlight", "namespace": "llm"}, "spec": cluster}
    node_types: dict[str, Any] = _derive_autoscaling_config_from_ray_cr(ray_cr)[
        "available_node_types"
    ]
    return node_types


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


def test_default_sizes_cover_what_the_benchmark_measured() -> None:
    fixed, per_gateway = _measured_cores()
    assert _millicores(HEAD["resources"]["requests"]["cpu"]) >= 1000 * fixed, (HEAD, fixed)
    assert SIZING["fixedCpuMillis"] >= 1000 * fixed, (SIZING, fixed)
    assert SIZING["cpuPerGatewayMillis"] >= 1000 * per_gateway, (SIZING, per_gateway)
    for per_pod in (1, 2, 4):
        cpu = _millicores(
            _resources(_gateway_group(_cluster(_values(4, per_pod))))["requests"]["cpu"]
        )
        assert cpu >= 1000 * (fixed + per_pod * per_gateway), per_pod


def test_neither_the_head_nor_a_gateway_pod_has_a_cpu_limit() -> None:
    """A CPU limit is a CFS quota: the request path would stall in bursts while the node
    has idle cores. Memory is limited as requested."""
    cluster = _cluster({})
    (head,) = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    for resources in (head["resources"], _resources(_gateway_group(cluster))):
        assert "cpu" not in resources["limits"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"]


@pytest.mark.parametrize("replicas", [1, 2, 4])
@pytest.mark.parametrize("per_pod", [1, 2])
def test_the_gateway_pods_fit_every_gateway_on_two_pods_or_more(
    replicas: int, per_pod: int
) -> None:
    rendered = render(_values(replicas, per_pod))
    assert not list(
        crd_validator("RayService", strict=True).iter_errors(rendered.one("RayService"))
    )
    group = _gateway_group(rendered.one("RayService")["spec"]["rayClusterConfig"])
    pods = group["replicas"]
    assert group["minReplicas"] == group["maxReplicas"] == pods  # fixed, not autoscaled
    assert replicas <= pods * per_pod  # every gateway has a unit
    assert pods >= min(replicas, 2)  # one pod's loss leaves a gateway from two gateways
    assert pods == min(replicas, 2) or (pods - 1) * per_pod < replicas  # no pod more
    resources = _resources(group)
    wanted_cpu = SIZING["fixedCpuMillis"] + per_pod * SIZING["cpuPerGatewayMillis"]
    assert _millicores(resources["requests"]["cpu"]) == wanted_cpu
    wanted_memory = SIZING["fixedMemoryMi"] + per_pod * SIZING["memoryPerGatewayMi"]
    assert resources["limits"]["memory"] == f"{wanted_memory}Mi"


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_the_autoscaler_places_gateways_only_on_gateway_pods_never_on_a_gpu_worker(
    replicas: int,
) -> None:
    """Ray's autoscaler, asked for every gateway replica's resources, starts gateway pods
    only, exactly the group's pods; one gateway more than they hold finds no node type
    (the head and the GPU workers advertise no gateway unit)."""
    node_types = _node_types(_cluster(_values(replicas)))
    with_units = {name for name, t in node_types.items() if t["resources"].get(GATEWAY_RESOURCE)}
    assert with_units == {"gateways"}
    gateways = node_types["gateways"]
    assert gateways["resources"]["CPU"] == 0  # no model replica reserving CPUs lands there
    assert "GPU" not in gateways["resources"] or gateways["resources"]["GPU"] == 0
    demand = [{GATEWAY_RESOURCE: GATEWAY_RESOURCE_PER_REPLICA}] * replicas

    def scorer(resources: Any, bundles: Any, node_type: str) -> Any:
        summary = NodeAvailabilitySummary(node_availabilities={})
        return _default_utilization_scorer(
            resources, bundles, node_type, node_availability_summary=summary
        )

    def plan(demand: list[dict[str, float]]) -> tuple[dict[str, int], list[dict[str, float]]]:
        existing = {"headgroup": 1}  # the head, already running
        added, residual = get_nodes_for(node_types, existing, "headgroup", 1000, demand, scorer)
        return dict(added), residual

    assert plan(demand) == ({"gateways": gateways["min_workers"]}, [])
    added, residual = plan([*demand, {GATEWAY_RESOURCE: GATEWAY_RESOURCE_PER_REPLICA}])
    assert added == {"gateways": gateways["max_workers"]}
    assert residual == [{GATEWAY_RESOURCE: GATEWAY_RESOURCE_PER_REPLICA}]


def test_a_gateway_pod_advertises_one_unit_per_gateway_it_is_sized_for() -> None:
    for per_pod in (1, 3):
        node_types = _node_types(_cluster(_values(4, per_pod)))
        assert node_types["gateways"]["resources"][GATEWAY_RESOURCE] == per_pod
    assert GATEWAY_RESOURCE_PER_REPLICA == 1


def test_gateway_replicas_change_no_pod_template_and_nothing_of_the_head() -> None:
    """KubeRay starts a new cluster (GPUs included) for a change of the cluster spec
    other than worker groups' replicas, minReplicas and maxReplicas; a change of
    gateway.replicas changes only those (and the Serve config, applied in place)."""

    def without_counts(cluster: dict[str, Any]) -> dict[str, Any]:
        cluster = json.loads(json.dumps(cluster))
        for group in cluster["workerGroupSpecs"]:
            for key in ("replicas", "minReplicas", "maxReplicas"):
                del group[key]
        return cluster

    clusters = [_cluster(_values(replicas)) for replicas in (1, 2, 4)]
    assert without_counts(clusters[0]) == without_counts(clusters[1]) == without_counts(clusters[2])
    assert [_gateway_group(c)["replicas"] for c in clusters] == [1, 2, 4]


def test_the_head_runs_no_gateway_and_takes_no_client_traffic() -> None:
    rendered = render({})
    assert rendered.one("RayService")["spec"]["excludeHeadPodFromServeSvc"] is True
    node_types = _node_types(rendered.one("RayService")["spec"]["rayClusterConfig"])
    assert GATEWAY_RESOURCE not in node_types["headgroup"]["resources"]
    assert node_types["headgroup"]["resources"]["CPU"] == 0


def test_the_rendered_application_places_its_gateways_on_the_gateway_pods() -> None:
    gateway = build_app(app_args(render({})))._bound_deployment
    assert gateway.name == "gateway"
    assert gateway.ray_actor_options == {
        "num_cpus": 0,
        "resources": {GATEWAY_RESOURCE: GATEWAY_RESOURCE_PER_REPLICA},
    }


def test_a_part_core_is_written_in_millicores() -> None:
    sizing = {**SIZING, "fixedCpuMillis": 300}
    values = {"rayCluster": {"gateways": {"gatewaysPerPod": 2, "sizing": sizing}}}
    cpu = _resources(_gateway_group(_cluster(values)))["requests"]["cpu"]
    assert cpu == f"{300 + 2 * SIZING['cpuPerGatewayMillis']}m"


def test_gateway_resources_set_by_the_operator_are_used_as_they_are() -> None:
    mine = {"requests": {"cpu": "3", "memory": "6Gi"}, "limits": {"cpu": "3", "memory": "6Gi"}}
    values = {"gateway": {"replicas": 4}, "rayCluster": {"gateways": {"resources": mine}}}
    assert _resources(_gateway_group(_cluster(values))) == mine


def test_gateway_pods_prefer_different_nodes_unless_told_otherwise() -> None:
    affinity = _gateway_group(_cluster({}))["template"]["spec"]["affinity"]
    (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    labels = _gateway_group(_cluster({}))["template"]["metadata"]["labels"]
    selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert selector.items() <= labels.items()
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    values = {"rayCluster": {"gateways": {"affinity": mine}}}
    assert _gateway_group(_cluster(values))["template"]["spec"]["affinity"] == mine


def test_a_worker_group_may_not_take_the_gateway_pods_name() -> None:
    group = {**DEFAULTS["rayCluster"]["workerGroups"][0], "name": "gateways"}
    with pytest.raises(helm.HelmError) as info:
        render({"rayCluster": {"workerGroups": [group]}})
    assert 'the name "gateways" is the chart\'s group of gateway pods' in str(info.value)


@pytest.mark.parametrize(
    ("gateways", "field"),
    [
        ({"gatewaysPerPod": 0}, "gatewaysPerPod"),
        ({"sizing": {**SIZING, "fixedCpuMillis": 0}}, "sizing/fixedCpuMillis"),
        ({"sizing": {**SIZING, "cpuPerGatewayMillis": "1"}}, "sizing/cpuPerGatewayMillis"),
        ({"sizing": {**SIZING, "memoryPerGatewayMi": 1.5}}, "sizing/memoryPerGatewayMi"),
    ],
)
def test_bad_gateway_sizing_is_refused_naming_the_field(
    gateways: dict[str, Any], field: str
) -> None:
    values = json.loads(json.dumps(DEFAULTS))
    values["rayCluster"]["gateways"].update(gateways)
    with helm.Chart.load(str(CHART_DIR)) as chart, pytest.raises(helm.HelmValuesError) as info:
        chart.validate_schema(values)
    assert f"/rayCluster/gateways/{field}" in str(info.value)
