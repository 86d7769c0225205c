"""The chart is safe by default: a PodDisruptionBudget exists only where it keeps a
worker running and still lets drains finish; the Prometheus Operator's objects render
only where the cluster serves their kinds (or when forced); and the RayService keeps
its GCS state in the region's Redis and names its upgrade strategy."""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from ray._private.services import get_address

from tests.chart.chart import (
    CHART_DIR,
    EXAMPLES,
    KUBE_VERSIONS,
    MONITORING_APIS,
    NAMESPACE,
    Rendered,
    crd_validator,
    load_values,
    render,
)

DEFAULTS = load_values(CHART_DIR / "values.yaml")
EXTERNAL = load_values(next(p for p in EXAMPLES if p.name == "external-redis.values.yaml"))
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
ALL_MONITORING_ON = {
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "enginePodMonitor": {"enabled": True},
    "rayPodMonitor": {"enabled": True},
}


def _workers(*groups: tuple[str, int]) -> dict[str, Any]:
    """Values with worker groups (name, minReplicas) shaped like the default group."""
    base = DEFAULTS["rayCluster"]["workerGroups"][0]
    return {
        "rayCluster": {
            "workerGroups": [
                {**copy.deepcopy(base), "name": name, "replicas": floor, "minReplicas": floor}
                for name, floor in groups
            ]
        }
    }


def _worker_labels(rendered: Rendered) -> dict[str, dict[str, str]]:
    ray = rendered.one("RayService")["spec"]["rayClusterConfig"]
    return {g["groupName"]: g["template"]["metadata"]["labels"] for g in ray["workerGroupSpecs"]}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def _gcs(rendered: Rendered) -> dict[str, Any] | None:
    options: dict[str, Any] | None = rendered.one("RayService")["spec"]["rayClusterConfig"].get(
        "gcsFaultToleranceOptions"
    )
    return options


# --- PodDisruptionBudgets ---------------------------------------------------------------


def _budgets(rendered: Rendered) -> dict[str, dict[str, Any]]:
    """The rendered budgets by the group they protect."""
    return {
        p["metadata"]["name"].removeprefix("firstlight-"): p
        for p in rendered.of_kind("PodDisruptionBudget")
    }


def test_default_single_worker_group_gets_no_budget_and_the_notes_say_so() -> None:
    """A budget on a one-pod group would allow zero running workers (maxUnavailable 1)
    or block every drain (minAvailable 1); the defaults render neither and warn. The
    default two gateways run on two gateway pods, which get one."""
    assert DEFAULTS["rayCluster"]["workerGroups"][0]["minReplicas"] == 1
    rendered = render()
    assert set(_budgets(rendered)) == {"gateways"}
    assert "No PodDisruptionBudget for worker group gpu" in rendered.notes
    assert "No PodDisruptionBudget for the gateway pods" not in rendered.notes


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_the_gateway_pods_keep_one_serving_through_drains_from_two_gateways(
    replicas: int,
) -> None:
    """Two gateways or more run on two pods or more: a budget keeps one of them through
    a drain (a gateway pod is ready only while its Serve proxy is, KubeRay's readiness
    probe, so a running pod is a serving one). One gateway on one pod: none, and the
    notes say what that means."""
    rendered = render({"gateway": {"replicas": replicas}})
    budgets = _budgets(rendered)
    if replicas == 1:
        assert "gateways" not in budgets
        assert "No PodDisruptionBudget for the gateway pods" in rendered.notes
        return
    pdb = budgets["gateways"]
    assert pdb["spec"]["minAvailable"] == 1
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(pdb, version, strict=True)
    labels = _worker_labels(rendered)
    assert [g for g, pod in labels.items() if _selects(pdb["spec"]["selector"], pod)] == [
        "gateways"
    ]
    assert "No PodDisruptionBudget for the gateway pods" not in rendered.notes


def test_two_worker_group_keeps_one_running_through_drains() -> None:
    rendered = render(_workers(("gpu", 2)))
    pdb = _budgets(rendered)["gpu"]
    assert pdb["spec"]["minAvailable"] == 1
    assert "maxUnavailable" not in pdb["spec"]  # not honoured for a RayCluster's pods
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(pdb, version, strict=True)
    labels = _worker_labels(rendered)
    assert [g for g, pod in labels.items() if _selects(pdb["spec"]["selector"], pod)] == ["gpu"]
    assert "No PodDisruptionBudget" not in rendered.notes


@pytest.mark.parametrize("min_available", [1, 2, 3])
def test_no_budget_ever_allows_zero_or_blocks_every_drain(min_available: int) -> None:
    """For every group floor: a rendered budget leaves at least one worker running and
    at least one eviction allowed at the floor; a group without one is named in NOTES."""
    groups = [(f"g{floor}", floor) for floor in range(5)]
    values = {**_workers(*groups), "podDisruptionBudget": {"minAvailable": min_available}}
    rendered = render(values)
    budgets = {name: pdb["spec"] for name, pdb in _budgets(rendered).items() if name != "gateways"}
    for name, floor in groups:
        if name in budgets:
            kept = budgets[name]["minAvailable"]
            assert kept >= 1, name  # never zero running workers
            assert floor - kept >= 1, name  # a drain can still evict one
        else:
            assert floor <= min_available, name
            assert f"No PodDisruptionBudget for worker group {name}:" in rendered.notes
    assert set(budgets) == {name for name, floor in groups if floor > min_available}


def test_budgets_can_be_turned_off() -> None:
    rendered = render({**_workers(("gpu", 2)), "podDisruptionBudget": {"enabled": False}})
    assert rendered.of_kind("PodDisruptionBudget") == []


# --- Prometheus Operator objects ---------------------------------------------------------

OFFLINE_CASES = [pytest.param({}, id="defaults")] + [
    pytest.param(load_values(path), id=path.name.removesuffix(".values.yaml")) for path in EXAMPLES
]


@pytest.mark.parametrize("values", OFFLINE_CASES)
def test_without_the_api_no_prometheus_operator_object_is_rendered(
    values: dict[str, Any],
) -> None:
    """A cluster without the Prometheus Operator: nothing of monitoring.coreos.com, so
    `helm install` cannot fail with "no matches for kind"."""
    values = copy.deepcopy(values)
    values.setdefault("monitoring", {}).update(copy.deepcopy(ALL_MONITORING_ON))
    rendered = render(values)
    assert [m.kind for m in rendered.manifests if "coreos" in m.doc["apiVersion"]] == []
    assert "Not created: PodMonitor, PrometheusRule, ServiceMonitor" in rendered.notes


def test_with_the_api_every_enabled_kind_renders_and_validates() -> None:
    rendered = render({"monitoring": ALL_MONITORING_ON}, api_versions=MONITORING_APIS)
    for kind in MONITORING_KINDS:
        docs = rendered.of_kind(kind)
        assert len(docs) == (2 if kind == "PodMonitor" else 1), kind  # engines' and Ray's
        for doc in docs:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            errors = list(crd_validator(kind, strict=True).iter_errors(doc))
            assert not errors, (kind, [e.message for e in errors])
    assert "Not created" not in rendered.notes


def test_each_kind_needs_its_own_resource_not_just_the_group_version() -> None:
    """A cluster may serve monitoring.coreos.com/v1 with only some of its kinds (CRDs
    are installed one by one): each object checks its own kind."""
    rendered = render(
        {"monitoring": ALL_MONITORING_ON},
        api_versions=["monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor"],
    )
    assert [m.kind for m in rendered.manifests if "coreos" in m.doc["apiVersion"]] == [
        "ServiceMonitor"
    ]
    assert "Not created: PodMonitor, PrometheusRule" in rendered.notes


def test_the_force_value_renders_them_offline() -> None:
    forced = {"monitoring": {**ALL_MONITORING_ON, "assumePrometheusOperator": True}}
    rendered = render(forced)
    assert sorted(m.kind for m in rendered.manifests if "coreos" in m.doc["apiVersion"]) == sorted(
        [*MONITORING_KINDS, "PodMonitor"]  # the engines' and Ray's
    )
    off = {"monitoring": {"assumePrometheusOperator": True, "serviceMonitor": {"enabled": False}}}
    assert render(off).of_kind("ServiceMonitor") == []  # enabled still decides


def test_grafana_dashboards_need_no_operator() -> None:
    assert len(render().of_kind("ConfigMap")) == 2  # plain ConfigMaps for the sidecar


# --- RayService: GCS fault tolerance and upgrade strategy ---------------------------------


def test_gcs_state_goes_to_the_in_chart_redis_with_its_password() -> None:
    rendered = render()
    gcs = _gcs(rendered)
    assert gcs is not None
    host, port, ssl = get_address(gcs["redisAddress"])  # how Ray's head reads it
    service = next(
        s for s in rendered.of_kind("Service") if s["metadata"]["name"] == "firstlight-redis"
    )
    assert (host, int(port), ssl) == (
        f"{service['metadata']['name']}.{NAMESPACE}.svc",
        service["spec"]["ports"][0]["port"],
        False,
    )
    ref = gcs["redisPassword"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("firstlight-redis", "password")  # the operator's
    assert set(gcs) == {"redisAddress", "redisPassword"}


def test_gcs_state_goes_to_the_external_redis_over_tls() -> None:
    gcs = _gcs(render(EXTERNAL))
    assert gcs is not None
    assert gcs["redisAddress"] == "rediss://master.hints.example.internal:6379"  # no /0
    assert get_address(gcs["redisAddress"]) == ("master.hints.example.internal", "6379", True)
    assert gcs["redisPassword"]["valueFrom"]["secretKeyRef"] == {
        "name": EXTERNAL["externalRedis"]["existingSecret"],
        "key": EXTERNAL["externalRedis"]["passwordKey"],
    }


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("redis://hints.internal/2", "hints.internal:6379"),
        ("rediss://hints.internal:6380", "rediss://hints.internal:6380"),
    ],
)
def test_external_redis_addresses_are_what_ray_parses(url: str, address: str) -> None:
    values = {"redis": {"enabled": False}, "externalRedis": {"url": url}}
    gcs = _gcs(render(values))
    assert gcs == {"redisAddress": address}  # no Secret: no password reference
    get_address(address)  # parses (a /0 suffix would have become part of the port)


def test_gcs_fault_tolerance_can_be_turned_off() -> None:
    rendered = render({"rayCluster": {"gcsFaultTolerance": {"enabled": False}}})
    assert _gcs(rendered) is None
    errors = list(crd_validator("RayService", strict=True).iter_errors(rendered.one("RayService")))
    assert not errors


@pytest.mark.parametrize("strategy", ["NewCluster", "None"])
def test_upgrade_strategy_is_explicit_and_valid(strategy: str) -> None:
    values = {} if strategy == "NewCluster" else {"rayCluster": {"upgradeStrategy": strategy}}
    rayservice = render(values).one("RayService")
    assert rayservice["spec"]["upgradeStrategy"] == {"type": strategy}
    assert not list(crd_validator("RayService", strict=True).iter_errors(rayservice))


def test_misplaced_or_misspelt_fields_fail_the_strict_crd_check() -> None:
    """The RayService fields are where KubeRay's schema has them: the same options one
    level off (on the RayService spec) or misspelt are rejected."""
    rayservice = render().one("RayService")
    validator = crd_validator("RayService", strict=True)
    spec = rayservice["spec"]
    gcs = spec["rayClusterConfig"]["gcsFaultToleranceOptions"]
    moved = {**rayservice, "spec": {**spec, "gcsFaultToleranceOptions": gcs}}
    assert list(validator.iter_errors(moved))
    cluster = {**spec["rayClusterConfig"], "gcsFaultToleranceOptions": {"redisAdress": "x:1"}}
    misspelt = {**rayservice, "spec": {**spec, "rayClusterConfig": cluster}}
    assert list(validator.iter_errors(misspelt))
    strategy = {**rayservice, "spec": {**spec, "upgradeStrategy": {"kind": "NewCluster"}}}
    assert list(validator.iter_errors(strategy))


def test_schema_rejects_an_unknown_upgrade_strategy() -> None:
    with helm.Chart.load(str(CHART_DIR)) as chart, pytest.raises(helm.HelmValuesError) as info:
        chart.validate_schema(
            {**DEFAULTS, "rayCluster": {**DEFAULTS["rayCluster"], "upgradeStrategy": "Recreate"}}
        )
    assert "/rayCluster/upgradeStrategy" in str(info.value)
