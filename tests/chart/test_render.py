"""The chart renders and lints clean for its defaults and every example values file, and
every object it renders is valid for Kubernetes (core kinds) or its CRD."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from firstlight.config import parse_config
from firstlight.serve.data_plane import ray_environment
from tests.chart.chart import (
    CHART_DIR,
    CRD_FILES,
    EXAMPLES,
    KUBE_VERSIONS,
    MONITORING_APIS,
    NAMESPACE,
    Rendered,
    app_args,
    crd_validator,
    load_values,
    pod_specs,
    render,
)

_DEFAULT_GROUP = load_values(CHART_DIR / "values.yaml")["rayCluster"]["workerGroups"][0]
_TWO_WORKERS = {
    "workerGroups": [{**_DEFAULT_GROUP, "replicas": 2, "minReplicas": 2}],
}
"""The default worker group with a floor of two pods (it gets a PodDisruptionBudget)."""

CASES = [pytest.param({}, id="defaults")] + [
    pytest.param(load_values(path), id=path.name.removesuffix(".values.yaml")) for path in EXAMPLES
]


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest) -> tuple[dict[str, Any], Rendered]:
    values: dict[str, Any] = request.param
    # As on a cluster that runs the Prometheus Operator, so its objects are validated too.
    return values, render(values, api_versions=MONITORING_APIS)


def test_the_examples_cover_the_required_variants() -> None:
    names = {path.name for path in EXAMPLES}
    assert {
        "us-east.values.yaml",  # two regions naming each other as peers
        "eu-west.values.yaml",
        "external-redis.values.yaml",
        "tls-off.values.yaml",
        "two-models.values.yaml",
    } <= names
    east, west = (
        load_values(path) for path in EXAMPLES if path.name.startswith(("us-east", "eu-west"))
    )
    east, west = sorted((east, west), key=lambda v: v["region"]["name"] != "us-east")
    assert [p["region"] for p in east["region"]["peers"]] == [west["region"]["name"]]
    assert [p["region"] for p in west["region"]["peers"]] == [east["region"]["name"]]
    assert east["hints"]["hash_seed"] == west["hints"]["hash_seed"]


def test_lint_is_clean(case: tuple[dict[str, Any], Rendered]) -> None:
    values, _ = case
    for version in KUBE_VERSIONS:
        report = helm.lint(
            str(CHART_DIR), values, strict=True, namespace=NAMESPACE, kube_version=f"v{version}.0"
        )
        assert report["errors"] == [], report
        # Severity 1 is informational ("icon is recommended"); warnings and worse fail.
        assert [m for m in report["messages"] if m["severity"] > 1] == [], report


def test_core_kinds_validate_against_kubernetes(case: tuple[dict[str, Any], Rendered]) -> None:
    _, rendered = case
    checked = 0
    for manifest in rendered.manifests:
        if manifest.kind in CRD_FILES or manifest.kind == "HTTPRoute":
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(manifest.doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = "/".join(str(p) for p in exc.path)
                pytest.fail(
                    f"{manifest.template} {manifest.kind} (k8s {version}) {where}: {exc.message}"
                )
        checked += 1
    assert checked >= 5  # Services, Secret, StatefulSet, policies, test pod...


def test_custom_resources_validate_against_their_crds(
    case: tuple[dict[str, Any], Rendered],
) -> None:
    _, rendered = case
    seen = set()
    for manifest in rendered.manifests:
        if manifest.kind not in CRD_FILES:
            continue
        validator = crd_validator(manifest.kind, strict=True)
        errors = sorted(validator.iter_errors(manifest.doc), key=str)
        assert not errors, f"{manifest.template}: " + "; ".join(
            f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors
        )
        seen.add(manifest.kind)
    assert "RayService" in seen


def test_crd_validation_can_fail() -> None:
    """The CRD schemas are permissive (no unknown-field checks); make sure they still
    reject what KubeRay would: serveConfigV2 as a mapping, a worker group without bounds."""
    rayservice = render().one("RayService")
    bad = {**rayservice, "spec": {**rayservice["spec"], "serveConfigV2": {"applications": []}}}
    assert list(crd_validator("RayService").iter_errors(bad))
    cluster = dict(rayservice["spec"]["rayClusterConfig"])
    cluster["workerGroupSpecs"] = [{"groupName": "x", "template": {"spec": {"containers": []}}}]
    bad = {**rayservice, "spec": {**rayservice["spec"], "rayClusterConfig": cluster}}
    assert list(crd_validator("RayService").iter_errors(bad))
    # A misspelt field passes the CRD as published but not the strict reading.
    head = dict(cluster["headGroupSpec"])
    cluster = {
        **rayservice["spec"]["rayClusterConfig"],
        "headGroupSpec": {**head, "rayStartParam": {}},
    }
    bad = {**rayservice, "spec": {**rayservice["spec"], "rayClusterConfig": cluster}}
    assert not list(crd_validator("RayService").iter_errors(bad))
    assert list(crd_validator("RayService", strict=True).iter_errors(bad))


def test_httproute_has_the_gateway_api_shape() -> None:
    """No schema for HTTPRoute ships anywhere here, so its fields are checked by name."""
    values = load_values(next(p for p in EXAMPLES if p.name == "external-redis.values.yaml"))
    route = render(values).one("HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert set(route["spec"]) == {"parentRefs", "hostnames", "rules"}
    assert route["spec"]["parentRefs"] == values["httpRoute"]["parentRefs"]
    (rule,) = route["spec"]["rules"]
    assert set(rule) == {"matches", "backendRefs"}
    for match in rule["matches"]:
        assert set(match) == {"path"}
        assert match["path"]["type"] in {"PathPrefix", "Exact"}
        assert match["path"]["value"].startswith("/")
    assert rule["backendRefs"] == [{"name": "firstlight-serve-svc", "port": 8000}]


def test_every_template_is_used_by_some_case() -> None:
    """An example or the defaults renders each template into at least one object, so
    nothing in templates/ goes unvalidated."""
    produced: set[str] = set()
    for param in CASES:
        produced |= {
            m.template for m in render(param.values[0], api_versions=MONITORING_APIS).manifests
        }
    produced |= {
        m.template
        for m in render(
            {"monitoring": {"rayPodMonitor": {"enabled": True}}, "rayCluster": _TWO_WORKERS},
            api_versions=MONITORING_APIS,
        ).manifests
    }
    templates = {
        f"firstlight/{p.relative_to(CHART_DIR).as_posix()}"
        for p in (CHART_DIR / "templates").rglob("*.yaml")
    }
    assert templates - produced == set()


def _pod_monitors(rendered: Rendered) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in rendered.of_kind("PodMonitor")}


def test_ray_pod_monitor_validates_when_enabled_and_leaves_vllm_to_the_engines() -> None:
    rendered = render(
        {"monitoring": {"rayPodMonitor": {"enabled": True}}}, api_versions=MONITORING_APIS
    )
    monitor = _pod_monitors(rendered)["firstlight-ray"]
    assert not list(crd_validator("PodMonitor", strict=True).iter_errors(monitor))
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "ray-metrics"
    # vLLM's series are the engine PodMonitor's, under vLLM's names: not stored twice.
    assert endpoint["metricRelabelings"] == [
        {"sourceLabels": ["__name__"], "regex": "ray_vllm_.+", "action": "drop"}
    ]


def test_engine_pod_monitor_is_on_by_default_and_scrapes_every_ray_pods_metrics_port() -> None:
    """vLLM's metrics reach Prometheus without Redis: from Ray's metrics agent on the
    Ray pods (whose containers name the port), relabelled to vLLM's names with this
    region's name (tests/serve/test_engine_metrics_ray.py runs the rules in Prometheus)."""
    rendered = render({"region": {"name": "eu-west"}}, api_versions=MONITORING_APIS)
    monitors = _pod_monitors(rendered)
    assert set(monitors) == {"firstlight-engines"}  # Ray's own stays off by default
    monitor = monitors["firstlight-engines"]
    assert not list(crd_validator("PodMonitor", strict=True).iter_errors(monitor))
    selector = monitor["spec"]["selector"]
    assert selector["matchExpressions"] == [
        {
            "key": "app.kubernetes.io/component",
            "operator": "In",
            "values": ["ray-head", "ray-worker"],
        }
    ]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "ray-metrics"
    for name, spec in pod_specs(rendered):
        if name.startswith("ray-"):
            ports = {p["name"] for c in spec["containers"] for p in c.get("ports", [])}
            assert "ray-metrics" in ports, name
    rules = endpoint["metricRelabelings"]
    assert rules[0] == {"sourceLabels": ["__name__"], "regex": "ray_vllm_.+", "action": "keep"}
    assert {"targetLabel": "region", "replacement": "eu-west", "action": "replace"} in rules
    assert "vllm:$1" in [r.get("replacement") for r in rules]
    off = render(
        {"monitoring": {"enginePodMonitor": {"enabled": False}}}, api_versions=MONITORING_APIS
    )
    assert _pod_monitors(off) == {}


@pytest.mark.parametrize(
    "gateway",
    [{}, {"ingress": "serve-proxy", "throughput_optimized": False}, {"ingress": "serve-proxy"}],
    ids=["defaults", "serve-proxy-plain", "serve-proxy-optimized"],
)
def test_every_ray_pod_gets_the_configured_data_plane(gateway: dict[str, Any]) -> None:
    """Ray Serve reads the ingress and data plane from its processes' environment: the
    chart must set what local mode sets for the same configuration, on head and workers."""
    rendered = render({"gateway": gateway} if gateway else {})
    config = parse_config(app_args(rendered)["config"])
    expected = ray_environment(config.gateway)
    specs = [(name, spec) for name, spec in pod_specs(rendered) if name.startswith("ray-")]
    assert len(specs) >= 2  # the head and a worker group
    for _, spec in specs:
        for container in spec["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert {name: env.get(name) for name in expected} == expected


_PLATFORM_VALUES: dict[str, Any] = {
    # OpenShift's restricted policy assigns user and group: the chart must not pin them.
    "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
    "serviceAccount": {"name": "firstlight-irsa", "automountToken": True},
    "priorityClassName": "inference-high",
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "firstlight"}},
        }
    ],
    "extraVolumes": [{"name": "ca-bundle", "configMap": {"name": "corporate-ca"}}],
    "extraVolumeMounts": [{"name": "ca-bundle", "mountPath": "/etc/ssl/corporate"}],
}


def test_a_platform_teams_pod_settings_reach_every_ray_pod() -> None:
    """Service account (IRSA, Pod Identity), priority, topology spread, extra volumes and
    a security context without pinned users (OpenShift) — on the head and every worker
    group, and the RayService still validates against its CRD."""
    rendered = render(_PLATFORM_VALUES)
    ray_pods = [(n, s) for n, s in pod_specs(rendered) if n.startswith("ray-")]
    assert len(ray_pods) >= 2
    for name, spec in ray_pods:
        assert spec["serviceAccountName"] == "firstlight-irsa", name
        assert spec["automountServiceAccountToken"] is True, name
        assert spec["priorityClassName"] == "inference-high", name
        assert spec["topologySpreadConstraints"] == _PLATFORM_VALUES["topologySpreadConstraints"]
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True, name
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(context), name
        assert {"name": "ca-bundle", "configMap": {"name": "corporate-ca"}} in spec["volumes"]
        (container,) = spec["containers"]
        assert {"name": "ca-bundle", "mountPath": "/etc/ssl/corporate"} in container["volumeMounts"]
    errors = list(crd_validator("RayService", strict=True).iter_errors(rendered.one("RayService")))
    assert not errors, [e.message for e in errors]


def test_by_default_no_token_is_mounted_and_users_are_pinned() -> None:
    for name, spec in pod_specs(render()):
        if not name.startswith("ray-"):
            continue
        assert spec["automountServiceAccountToken"] is False, name
        assert "serviceAccountName" not in spec, name
        assert spec["securityContext"]["runAsUser"] == 1000, name
