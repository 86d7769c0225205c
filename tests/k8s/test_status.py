"""``firstlight status`` against loopback stand-ins for Kubernetes API servers.

No Kubernetes cluster can run on these machines, so each "cluster" here is a local HTTP
server standing in for one API server (:mod:`tests.k8s.fake_apiserver`): it serves only
the read-only paths the command uses, with JSON shaped like the real API, and records
every request. Two stand-ins are regions (us-east: healthy, behind an Ingress; eu-west:
an unhealthy app, behind an HTTPRoute); a third context points at a closed port, so its
connection is refused at once. The dashboard body is checked against Ray's own model.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from click.testing import Result
from typer.testing import CliRunner

from firstlight.k8s import AppStatus, Condition, RegionStatus
from firstlight.k8s._model import endpoint_from_ingresses
from firstlight.k8s.cli import status
from firstlight.k8s.status import collect_status
from tests.chart.chart import crd_validator
from tests.k8s.api_objects import (
    EU_HEAD,
    HTTPROUTE,
    INGRESS,
    NS,
    UNRELATED,
    rayservice,
    serve_details,
)
from tests.k8s.fake_apiserver import FakeCluster, closed_port, serving, write_kubeconfig

runner = CliRunner()
app = typer.Typer()
app.callback()(lambda: None)  # a group, so `status` is a subcommand as in the main CLI
app.command("status")(status)


@pytest.fixture(autouse=True)
def _no_proxy_for_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubernetes client honours HTTP(S)_PROXY; the stand-ins are on 127.0.0.1."""
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1")


@pytest.fixture
def clusters() -> Iterator[dict[str, FakeCluster]]:
    unlabelled = {**rayservice("other", "RUNNING", "HEALTHY"), "metadata": UNRELATED["metadata"]}
    unhealthy = rayservice(
        "eu-west", "UNHEALTHY", "UNHEALTHY", "model-x: a replica failed its health check", EU_HEAD
    )
    fakes = {
        "us-east": FakeCluster(
            token="token-us-east",
            rayservices=[rayservice("us-east", "RUNNING", "HEALTHY"), unlabelled],
            ingresses=[{**UNRELATED, "spec": {"rules": [{"host": "x.example.com"}]}}, yaml.safe_load(INGRESS)],
            dashboards={(NS, "firstlight-us-east-head-svc"): (200, serve_details({"model-x": (2, 2), "gateway": (1, 1)}))},
        ),
        "eu-west": FakeCluster(
            token="token-eu-west",
            rayservices=[unhealthy],
            httproutes=[yaml.safe_load(HTTPROUTE)],
            dashboards={(NS, EU_HEAD): (200, serve_details({"model-x": (1, 2), "gateway": (1, 1)}))},
        ),
    }  # fmt: skip
    with serving(fakes):
        yield fakes


@pytest.fixture
def kubeconfig(tmp_path: Path, clusters: dict[str, FakeCluster]) -> Path:
    servers = {name: (fake.url, fake.token) for name, fake in clusters.items()}
    servers["us-west-dead"] = (f"http://127.0.0.1:{closed_port()}", "token-dead")
    return write_kubeconfig(tmp_path / "kubeconfig", servers)


def run(kubeconfig: Path, *args: str) -> Result:
    args = ("status", "--kubeconfig", str(kubeconfig), "--timeout", "5", *args)
    return runner.invoke(app, args, env={"COLUMNS": "250"})


def brief(region: dict[str, Any]) -> tuple[Any, ...]:
    """A region of the JSON output in one line: who, health, apps, deployments, endpoint."""
    apps = region["applications"]
    deps = [
        f"{d['name']} {d['running_replicas']}/{d['target_replicas']} {d['status']}"
        for a in apps
        for d in a["deployments"]
    ]
    return (region["region"], f"{region['namespace']}/{region['name']}", region["service_status"], region["ready"],
            region["healthy"], [(a["name"], a["status"]) for a in apps], deps, region["endpoint"])  # fmt: skip


def test_json_lists_every_context_in_order_and_only_reads(
    kubeconfig: Path, clusters: dict[str, FakeCluster]
) -> None:
    result = run(kubeconfig, "--output", "json")
    assert result.exit_code == 0, result.output
    east, west, dead = json.loads(result.stdout)
    assert [c["context"] for c in (east, west, dead)] == ["us-east", "eu-west", "us-west-dead"]

    assert (east["reachable"], east["error"], east["healthy"]) == (True, None, True)
    assert [brief(r) for r in east["regions"]] == [  # the label selector left "other" out
        ("us-east", "firstlight/firstlight-us-east", "Running", True, True, [("firstlight", "RUNNING")],
         ["gateway 1/1 HEALTHY", "model-x 2/2 HEALTHY"], "https://us-east.llm.example.com"),
    ]  # fmt: skip
    ready = {"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints", "message": ""}
    assert east["regions"][0]["conditions"] == [ready]
    assert (west["reachable"], west["error"], west["healthy"]) == (True, None, False)
    assert [brief(r) for r in west["regions"]] == [
        ("eu-west", "firstlight/firstlight-eu-west", "Running", True, False, [("firstlight", "UNHEALTHY")],
         ["gateway 1/1 HEALTHY", "model-x 1/2 UNHEALTHY"], "https://eu-west.llm.example.com"),
    ]  # fmt: skip
    assert (dead["reachable"], dead["healthy"], dead["regions"]) == (False, False, [])
    assert "Connection refused" in dead["error"]

    assert {method for c in clusters.values() for method, _, _ in c.requests} == {"GET"}
    dashboard = "/services/{}:8265/proxy/api/serve/applications/"
    assert clusters["us-east"].requests == [
        (
            "GET",
            "/apis/ray.io/v1/rayservices",
            {"labelSelector": ["app.kubernetes.io/name=firstlight"]},
        ),
        ("GET", f"/api/v1/namespaces/{NS}" + dashboard.format("firstlight-us-east-head-svc"), {}),
        (
            "GET",
            f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses",
            {"labelSelector": ["app.kubernetes.io/instance=firstlight"]},
        ),
    ]
    assert clusters["eu-west"].paths()[1:] == [
        f"/api/v1/namespaces/{NS}" + dashboard.format(EU_HEAD),
        f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses",
        f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/httproutes",
    ]


def test_check_fails_on_an_unreachable_context_or_an_unhealthy_region(kubeconfig: Path) -> None:
    assert run(kubeconfig, "--check").exit_code == 1
    assert run(kubeconfig, "--check", "--context", "us-west-dead").exit_code == 1
    assert run(kubeconfig, "--check", "--context", "eu-west").exit_code == 1
    assert run(kubeconfig, "--check", "--context", "us-east").exit_code == 0


def test_context_option_selects_only_the_named_contexts(
    kubeconfig: Path, clusters: dict[str, FakeCluster]
) -> None:
    result = run(kubeconfig, "--context", "eu-west", "--output", "json", "--namespace", NS)
    assert result.exit_code == 0, result.output
    assert [c["context"] for c in json.loads(result.stdout)] == ["eu-west"]
    assert clusters["us-east"].requests == []
    assert clusters["eu-west"].paths()[0] == f"/apis/ray.io/v1/namespaces/{NS}/rayservices"


def test_an_unknown_context_exits_2_naming_it(
    kubeconfig: Path, clusters: dict[str, FakeCluster]
) -> None:
    result = run(kubeconfig, "--context", "us-east", "--context", "ap-south")
    assert result.exit_code == 2
    assert "no context named ap-south" in result.stderr
    assert "Traceback" not in result.output
    assert clusters["us-east"].requests == []


def test_table_names_the_regions_and_the_unreachable_context(kubeconfig: Path) -> None:
    result = run(kubeconfig)
    assert result.exit_code == 0, result.output
    for text in ("us-east", "eu-west", "us-west-dead", "unreachable", "Connection refused", "model-x 2/2 HEALTHY",
                 "model-x 1/2 UNHEALTHY", "https://us-east.llm.example.com"):  # fmt: skip
        assert text in result.stdout


def test_a_failing_dashboard_leaves_replicas_unknown_not_the_cluster(
    kubeconfig: Path, clusters: dict[str, FakeCluster]
) -> None:
    clusters["us-east"].dashboards = {(NS, "firstlight-us-east-head-svc"): (503, None)}
    [east] = collect_status(["us-east"], str(kubeconfig), namespace=None, timeout_s=5)
    assert (east.reachable, east.error) == (True, None)
    [region] = east.regions
    assert region.service_status == "Running"
    assert "HTTP 503" in str(region.replicas_error)
    assert {
        (d.running_replicas, d.target_replicas) for d in region.applications[0].deployments
    } == {(None, None)}
    assert region.endpoint == "https://us-east.llm.example.com"
    table = run(kubeconfig, "--context", "us-east").stdout
    assert "model-x ?/? HEALTHY" in table
    assert "replicas unknown" in table


def test_a_refused_token_is_an_error_of_a_reachable_server(
    kubeconfig: Path, clusters: dict[str, FakeCluster]
) -> None:
    clusters["us-east"].token = "rotated"
    [east] = collect_status(["us-east"], str(kubeconfig), namespace=None, timeout_s=5)
    assert (east.reachable, east.regions, east.healthy) == (True, (), False)
    assert "HTTP 401" in str(east.error)


def test_a_hung_server_is_unreachable_within_the_deadline(
    kubeconfig: Path, clusters: dict[str, FakeCluster]
) -> None:
    clusters["eu-west"].hold = hold = threading.Event()
    try:
        east, west = collect_status(
            ["us-east", "eu-west"], str(kubeconfig), namespace=None, timeout_s=0.2
        )
    finally:
        hold.set()
    assert (east.context, east.healthy) == ("us-east", True)
    assert (west.context, west.reachable, west.regions) == ("eu-west", False, ())
    assert "timed out" in str(west.error)


def test_a_tls_failure_is_unreachable(tmp_path: Path, clusters: dict[str, FakeCluster]) -> None:
    plain_http = clusters["us-east"].url.replace("http://", "https://")  # no TLS behind it
    path = write_kubeconfig(tmp_path / "tls", {"tls": (plain_http, "token-us-east")})
    [result] = collect_status(["tls"], str(path), namespace=None, timeout_s=5)
    assert (result.reachable, result.regions) == (False, ())
    assert str(result.error).startswith("TLS: SSLError: [SSL")


def test_a_broken_context_entry_is_reported_not_raised(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "broken", {"ok": ("http://127.0.0.1:1", "t")})
    path.write_text(path.read_text().replace("cluster: ok", "cluster: missing"))
    [result] = collect_status(["ok"], str(path), namespace=None, timeout_s=5)
    assert (result.reachable, result.healthy) == (False, False)
    assert str(result.error).startswith("kubeconfig: ")


def test_a_missing_kubeconfig_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    result = run(tmp_path / "nowhere.yaml")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: kubeconfig not found: {tmp_path / 'nowhere.yaml'}"


def test_kubeconfig_defaults_to_the_environment_variable(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    result = runner.invoke(app, ["status", "--context", "us-east", "--output", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["regions"][0]["region"] == "us-east"


def test_the_fake_rayservice_status_uses_only_fields_of_the_kuberay_crd() -> None:
    """Types, enums, required fields and — read strictly, since the API server would
    prune them silently — no field the CRD does not define."""
    item = rayservice("eu-west", "UNHEALTHY", "UNHEALTHY", "m", EU_HEAD)
    errors = list(crd_validator("RayService", strict=True).iter_errors(item))
    assert errors == [], [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors]


def test_the_fake_dashboard_body_is_a_valid_ray_serve_instance_details() -> None:
    from ray.serve.schema import ServeInstanceDetails

    details = ServeInstanceDetails.model_validate(serve_details({"model-x": (1, 2)}))
    deployment = details.applications["firstlight"].deployments["model-x"]
    assert deployment.target_num_replicas == 2
    assert [r.state.value for r in deployment.replicas] == ["RUNNING", "STARTING"]


@pytest.mark.parametrize(
    ("service_status", "ready", "app_statuses", "healthy"),
    [
        ("Running", None, ["RUNNING"], True),
        ("Running", "True", ["RUNNING", "RUNNING"], True),
        (None, "True", ["RUNNING"], True),  # serviceStatus dropped: the Ready condition decides
        ("Running", "False", ["RUNNING"], False),
        (None, None, ["RUNNING"], False),  # KubeRay >= 1.3 omits serviceStatus when not ready
        ("Running", None, ["RUNNING", "DEPLOYING"], False),
        ("Running", None, ["DEPLOY_FAILED"], False),
        ("Running", None, [], False),  # nothing deployed
    ],
)
def test_region_health(
    service_status: str | None, ready: str | None, app_statuses: list[str], healthy: bool
) -> None:
    conditions = () if ready is None else (Condition("Ready", ready),)
    apps = tuple(AppStatus(f"app{i}", s) for i, s in enumerate(app_statuses))
    assert (
        RegionStatus("r", NS, "rs", "firstlight", service_status, conditions, apps).healthy
        is healthy
    )


@pytest.mark.parametrize(
    ("spec", "endpoint"),
    [
        (
            {"tls": [{"hosts": ["a.example.com"]}], "rules": [{"host": "a.example.com"}]},
            "https://a.example.com",
        ),
        (
            {"tls": [{"hosts": ["b.example.com"]}], "rules": [{"host": "a.example.com"}]},
            "http://a.example.com",
        ),
        ({"rules": [{"http": {}}, {"host": "c.example.com"}]}, "http://c.example.com"),
        ({"defaultBackend": {"service": {"name": "x"}}}, None),
    ],
)
def test_endpoint_from_ingresses(spec: dict[str, Any], endpoint: str | None) -> None:
    assert endpoint_from_ingresses([{"metadata": {"name": "i"}, "spec": spec}]) == endpoint
