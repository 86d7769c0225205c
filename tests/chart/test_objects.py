"""What the rendered objects mean: the pieces reference each other correctly, pods are
locked down, secrets stay in Secrets, the network is closed except the gateway, and the
monitoring objects carry the observability issue's rules and dashboards."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import trustme
import yaml
from helm_python.errors import HelmRenderError
from ray._private.services import get_address

from firstlight.config import parse_config
from tests.chart.chart import (
    CHART_DIR,
    EXAMPLES,
    MONITORING_APIS,
    NAMESPACE,
    Rendered,
    app_args,
    load_values,
    pod_specs,
    render,
)
from tests.conftest import REPO_ROOT

EAST = load_values(next(p for p in EXAMPLES if p.name == "us-east.values.yaml"))
EXTERNAL = load_values(next(p for p in EXAMPLES if p.name == "external-redis.values.yaml"))
TWO_MODELS = load_values(next(p for p in EXAMPLES if p.name == "two-models.values.yaml"))


def _ray_pods(rendered: Rendered) -> list[tuple[str, dict[str, Any]]]:
    return [(name, spec) for name, spec in pod_specs(rendered) if name.startswith("ray-")]


def _env(spec: dict[str, Any]) -> dict[str, Any]:
    (container,) = spec["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _pod_labels(rendered: Rendered) -> dict[str, dict[str, str]]:
    ray = rendered.one("RayService")["spec"]["rayClusterConfig"]
    labels = {"ray-head": ray["headGroupSpec"]["template"]["metadata"]["labels"]}
    for group in ray["workerGroupSpecs"]:
        labels[f"worker/{group['groupName']}"] = group["template"]["metadata"]["labels"]
    for sts in rendered.of_kind("StatefulSet"):
        labels["redis"] = sts["spec"]["template"]["metadata"]["labels"]
    return labels


def test_every_pod_runs_unprivileged_as_non_root() -> None:
    for values in ({}, EAST, EXTERNAL):
        for name, spec in pod_specs(render(values)):
            assert spec["securityContext"]["runAsNonRoot"] is True, name
            assert spec["securityContext"]["runAsUser"] != 0, name
            assert spec["automountServiceAccountToken"] is False, name
            for container in spec["containers"]:
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False, name
                assert context["capabilities"]["drop"] == ["ALL"], name


def test_every_ray_pod_shares_the_hash_seed() -> None:
    rendered = render(EAST)
    pods = _ray_pods(rendered)
    assert [name for name, _ in pods] == ["ray-head", "ray-worker/gateways", "ray-worker/l4"]
    for name, spec in pods:
        assert _env(spec)["PYTHONHASHSEED"] == str(EAST["hints"]["hash_seed"]), name
    assert app_args(rendered)["config"]["hints"]["hash_seed"] == EAST["hints"]["hash_seed"]


def test_worker_groups_carry_gpus_placement_and_autoscaling_bounds() -> None:
    ray = render(TWO_MODELS).one("RayService")["spec"]["rayClusterConfig"]
    assert ray["enableInTreeAutoscaling"] is True
    assert ray["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    assert "nvidia.com/gpu" not in json.dumps(ray["headGroupSpec"])
    groups = {g["groupName"]: g for g in ray["workerGroupSpecs"]}
    for wanted in TWO_MODELS["rayCluster"]["workerGroups"]:
        group = groups[wanted["name"]]
        assert (group["minReplicas"], group["maxReplicas"]) == (
            wanted["minReplicas"],
            wanted["maxReplicas"],
        )
        spec = group["template"]["spec"]
        (container,) = spec["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == wanted["gpus"]
        assert container["resources"]["requests"] == wanted["resources"]["requests"]
        assert spec["tolerations"] == wanted["tolerations"]
        assert spec.get("nodeSelector") == wanted.get("nodeSelector")


def test_secrets_are_mounted_files_never_inline() -> None:
    rendered = render(EAST)
    config = app_args(rendered)["config"]
    assert config["auth"] == {
        "enabled": True,
        "api_keys": [{"file": "/var/run/secrets/firstlight/api-keys/api-key-0"}],
        "operator_keys": [{"file": "/var/run/secrets/firstlight/operator/operator-key"}],
        "peer_secret": {"file": "/var/run/secrets/firstlight/peer/peer-secret"},
    }
    assert config["hints"]["password"] == {"file": "/var/run/secrets/firstlight/redis/password"}
    for name, spec in _ray_pods(rendered):
        (container,) = spec["containers"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for path, secret in (
            ("/var/run/secrets/firstlight/api-keys", "firstlight-api-keys"),
            ("/var/run/secrets/firstlight/redis", "firstlight-redis"),
            ("/var/run/secrets/firstlight/peer", "firstlight-peer"),
            ("/var/run/secrets/firstlight/operator", "firstlight-operator"),
        ):
            assert mounts[path]["readOnly"] is True, name
            assert volumes[mounts[path]["name"]]["secret"]["secretName"] == secret, name
    assert rendered.of_kind("Secret") == []  # every secret is the operator's


def test_two_renders_are_the_same() -> None:
    """The hole: the in-chart Redis password was made with ``lookup`` and
    ``randAlphaNum``, so ``helm template`` (and GitOps tools that render) produced a new
    password, and a new Secret, at every render. Now nothing in the chart is random."""
    for values in ({}, EAST, EXTERNAL, TWO_MODELS):
        first, second = render(values), render(values)
        assert [m.doc for m in first.manifests] == [m.doc for m in second.manifests]


def test_the_in_chart_redis_needs_the_operators_secret() -> None:
    with pytest.raises(HelmRenderError, match=r"redis\.existingSecret is required"):
        render({"redis": {"existingSecret": ""}})


def test_in_chart_redis_is_reached_by_its_service_with_auth_and_no_persistence() -> None:
    rendered = render(EAST)
    url = app_args(rendered)["config"]["hints"]["redis_url"]
    services = {s["metadata"]["name"]: s for s in rendered.of_kind("Service")}
    assert url == f"redis://firstlight-redis.{NAMESPACE}.svc:6379/0"
    redis_service = services["firstlight-redis"]
    assert _matches(
        {"matchLabels": redis_service["spec"]["selector"]}, _pod_labels(rendered)["redis"]
    )
    (sts,) = rendered.of_kind("StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    script = container["args"][0]
    assert "requirepass $REDIS_PASSWORD" in script
    assert '--save ""' in script
    assert container["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "firstlight-redis"
    assert "volumeClaimTemplates" not in sts["spec"]


TLS_REDIS = {**EAST, "redis": {"tls": {"enabled": True, "existingSecret": "redis-tls"}}}


def test_the_in_chart_redis_can_speak_tls_only_and_everyone_verifies_it() -> None:
    """The hole: the in-chart Redis was plain ``redis://`` (its password and every hint
    in clear on the pod network), with no way to turn TLS on."""
    rendered = render(TLS_REDIS)
    config = parse_config(app_args(rendered)["config"])
    secrets = "/var/run/secrets/firstlight"
    assert config.hints.redis_url == f"rediss://firstlight-redis.{NAMESPACE}.svc:6379/0"
    assert config.hints.tls_ca_file == Path(f"{secrets}/redis-tls/ca.crt")
    gcs = rendered.one("RayService")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert get_address(gcs["redisAddress"])[2] is True  # Ray's GCS connects with TLS
    for name, spec in _ray_pods(rendered):
        (container,) = spec["containers"]
        assert {"name": "RAY_REDIS_CA_CERT", "value": f"{secrets}/redis-tls/ca.crt"} in container[
            "env"
        ], name
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["redis-tls-ca"] == f"{secrets}/redis-tls", name
        volumes = {v["name"]: v for v in spec["volumes"]}
        ca = volumes["redis-tls-ca"]["secret"]
        assert (ca["secretName"], ca["items"]) == (
            "redis-tls",
            [{"key": "ca.crt", "path": "ca.crt"}],
        )
    (sts,) = rendered.of_kind("StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "redis-tls", "defaultMode": 0o440}} in pod[
        "volumes"
    ]
    (container,) = pod["containers"]
    assert "--tls --cacert /tls/ca.crt" in container["readinessProbe"]["exec"]["command"][2]
    with pytest.raises(HelmRenderError, match=r"redis\.tls\.existingSecret is required"):
        render({"redis": {"tls": {"enabled": True}}})


def test_the_rendered_redis_configuration_serves_tls_only_on_a_real_redis(tmp_path: Path) -> None:
    """The in-chart Redis's configuration, as rendered, run by a real ``redis-server``
    with a test CA's certificate in place of the Secret's: a client that verifies the
    server against the CA gets in with the password; a plain connection does not."""
    (sts,) = render(TLS_REDIS).of_kind("StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    script = container["args"][0]
    lines = script.split("<<EOF\n", 1)[1].split("\nEOF", 1)[0].splitlines()
    ca = trustme.CA()
    issued = ca.issue_cert("localhost")
    files = {"tls.crt": tmp_path / "tls.crt", "tls.key": tmp_path / "tls.key"}
    issued.cert_chain_pems[0].write_to_path(str(files["tls.crt"]))
    issued.private_key_pem.write_to_path(str(files["tls.key"]))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    port = _free_port()
    conf = "\n".join(line.strip() for line in lines)
    conf = conf.replace("$REDIS_PASSWORD", "pw").replace("/tls/", f"{tmp_path}/")
    conf = conf.replace("tls-port 6379", f"tls-port {port}")
    assert "port 0" in conf.splitlines()
    server = subprocess.Popen(
        ["redis-server", "-", "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        assert server.stdin is not None
        server.stdin.write(conf.encode() + b"\n")
        server.stdin.close()
        verified = redis.Redis(
            host="localhost", port=port, password="pw", ssl=True,
            ssl_ca_certs=str(tmp_path / "ca.crt"), socket_timeout=2,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                assert verified.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
        plain = redis.Redis(host="localhost", port=port, password="pw", socket_timeout=2)
        with pytest.raises(redis.ConnectionError):
            plain.ping()
    finally:
        server.kill()
        server.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_external_redis_uses_its_url_and_secret_and_no_redis_is_rendered() -> None:
    rendered = render(EXTERNAL)
    hints = app_args(rendered)["config"]["hints"]
    assert hints["redis_url"] == EXTERNAL["externalRedis"]["url"]
    assert hints["password"] == {"file": "/var/run/secrets/firstlight/redis/password"}
    assert rendered.of_kind("StatefulSet") == []
    assert rendered.of_kind("Secret") == []
    for _, spec in _ray_pods(rendered):
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["redis-password"]["secret"]["secretName"] == "hints-redis"


def test_services_select_the_pods_they_serve() -> None:
    rendered = render(EAST, api_versions=MONITORING_APIS)
    labels = _pod_labels(rendered)
    metrics = next(
        s for s in rendered.of_kind("Service") if s["metadata"]["name"].endswith("-metrics")
    )
    selected = [
        n
        for n, pod in labels.items()
        if _matches({"matchLabels": metrics["spec"]["selector"]}, pod)
    ]
    assert selected == ["ray-head"]  # one scrape target per region
    monitor = rendered.one("ServiceMonitor")
    assert _matches(monitor["spec"]["selector"], metrics["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] == metrics["spec"]["ports"][0]["name"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # /metrics answers only to an operator key: Prometheus scrapes with the chart's.
    assert monitor["spec"]["endpoints"][0]["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "firstlight-operator", "key": "operator-key"},
    }
    for pdb in rendered.of_kind("PodDisruptionBudget"):
        selected = [n for n, pod in labels.items() if _matches(pdb["spec"]["selector"], pod)]
        assert selected == [f"worker/{pdb['metadata']['name'].removeprefix('firstlight-')}"]


def test_ingress_serves_the_api_over_tls_to_kuberays_serve_service() -> None:
    rendered = render(EAST)
    ingress = rendered.one("Ingress")
    rayservice = rendered.one("RayService")["metadata"]["name"]
    assert ingress["spec"]["tls"] == [
        {"hosts": ["us-east.llm.example.com"], "secretName": "firstlight-tls"}
    ]
    assert ingress["metadata"]["annotations"]["cert-manager.io/cluster-issuer"] == "letsencrypt"
    (rule,) = ingress["spec"]["rules"]
    paths = {p["path"] for p in rule["http"]["paths"]}
    assert paths == {"/v1", "/readyz", "/healthz"}  # no dashboard or metrics outside
    for path in rule["http"]["paths"]:
        assert path["backend"]["service"] == {
            "name": f"{rayservice}-serve-svc",
            "port": {"number": 8000},
        }
    both = render({**EAST, "ingress": {**EAST["ingress"], "extraHosts": ["llm.example.com"]}})
    spec = both.one("Ingress")["spec"]
    assert spec["tls"][0]["hosts"] == ["us-east.llm.example.com", "llm.example.com"]
    assert [r["host"] for r in spec["rules"]] == ["us-east.llm.example.com", "llm.example.com"]
    assert spec["rules"][0]["http"] == spec["rules"][1]["http"]
    opened = render({**EAST, "ingress": {**EAST["ingress"], "exposeOperatorPaths": True}})
    (rule,) = opened.one("Ingress")["spec"]["rules"]
    assert {"/dashboard", "/metrics"} <= {p["path"] for p in rule["http"]["paths"]}


def test_tls_off_renders_a_plain_http_ingress() -> None:
    values = load_values(next(p for p in EXAMPLES if p.name == "tls-off.values.yaml"))
    rendered = render(values)
    assert "tls" not in rendered.one("Ingress")["spec"]
    assert "http://us-west.llm.internal.example.com/v1" in rendered.notes
    assert rendered.of_kind("NetworkPolicy") == []


def test_network_policies_open_only_the_gateway_port_to_everyone() -> None:
    rendered = render(EAST)
    labels = _pod_labels(rendered)
    policies = {p["metadata"]["name"]: p["spec"] for p in rendered.of_kind("NetworkPolicy")}
    ray = policies["firstlight-ray"]
    assert {n for n, pod in labels.items() if _matches(ray["podSelector"], pod)} == {
        "ray-head",
        "worker/gateways",
        "worker/l4",
    }
    open_rules = [r for r in ray["ingress"] if "from" not in r]
    assert open_rules == [{"ports": [{"protocol": "TCP", "port": 8000}]}]
    for rule in ray["ingress"]:
        if "from" in rule and "ports" not in rule:  # all ports: only the release's Ray pods
            assert rule["from"] == [{"podSelector": ray["podSelector"]}]
    redis = policies["firstlight-redis"]
    assert {n for n, pod in labels.items() if _matches(redis["podSelector"], pod)} == {"redis"}
    (rule,) = redis["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    (peer,) = rule["from"]
    assert {n for n, pod in labels.items() if _matches(peer["podSelector"], pod)} == {
        "ray-head",
        "worker/gateways",
        "worker/l4",
    }


def _metrics_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    ray = next(
        p["spec"]
        for p in render(values).of_kind("NetworkPolicy")
        if p["metadata"]["name"].endswith("-ray")
    )
    return [r for r in ray["ingress"] if {"port": 8080, "protocol": "TCP"} in r.get("ports", [])]


def test_rays_metrics_port_is_open_to_the_scraper_while_a_pod_monitor_reads_it() -> None:
    """vLLM's metrics are scraped from Ray's metrics agent (the engine PodMonitor, on by
    default): Prometheus must reach port 8080, and nobody else when no monitor reads it."""
    (rule,) = _metrics_rules({})
    assert rule["from"] == [{"namespaceSelector": {}}]  # networkPolicy.metricsFrom
    off = {"enginePodMonitor": {"enabled": False}, "rayPodMonitor": {"enabled": False}}
    assert _metrics_rules({"monitoring": off}) == []
    ray_only = {"enginePodMonitor": {"enabled": False}, "rayPodMonitor": {"enabled": True}}
    assert len(_metrics_rules({"monitoring": ray_only})) == 1


def _operator_rule(ray: dict[str, Any]) -> dict[str, Any]:
    (rule,) = [r for r in ray["ingress"] if {"port": 8265, "protocol": "TCP"} in r.get("ports", [])]
    return rule


def test_rays_dashboard_is_open_only_to_the_operators_namespace() -> None:
    """The hole: the rule for the KubeRay operator matched its label in every namespace
    (an empty namespaceSelector), so any pod anyone labelled so could reach Ray's
    dashboard, whose Jobs API runs code beside the API keys. Now it names the namespace
    the Terraform installs the operator in, and a selector of every namespace does not
    render."""
    ray = next(
        p["spec"]
        for p in render(EAST).of_kind("NetworkPolicy")
        if p["metadata"]["name"].endswith("-ray")
    )
    (peer,) = _operator_rule(ray)["from"]
    namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    platform_tf = (REPO_ROOT / "terraform/modules/region-aws/platform.tf").read_text()
    operator_release = platform_tf.split('resource "helm_release" "kuberay_operator"')[1]
    assert f'namespace        = "{namespace}"' in operator_release.split("}")[0]
    # Values merge into the defaults: clearing the labels leaves an empty selector.
    every = {"kubeRayOperator": {"namespaceSelector": {"matchLabels": None}}}
    with pytest.raises(HelmRenderError, match=r"namespaceSelector is empty"):
        render({"networkPolicy": every})
    # An operator in the release's own namespace: no namespace selector at all.
    same = {"kubeRayOperator": {"namespaceSelector": None}}
    ray = render({"networkPolicy": same}).of_kind("NetworkPolicy")[0]["spec"]
    (peer,) = _operator_rule(ray)["from"]
    assert list(peer) == ["podSelector"]


def test_with_egress_on_the_ray_pods_reach_only_their_release_dns_redis_and_listed_rules() -> None:
    off = render(EAST).of_kind("NetworkPolicy")
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in off)
    assert all("egress" not in p["spec"] for p in off)
    extra = {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 6380}]}
    egress = {"enabled": True, "to": [extra]}
    for values, with_redis in ((EAST, True), (EXTERNAL, False)):
        rendered = render({**values, "networkPolicy": {"egress": egress}})
        labels = _pod_labels(rendered)
        ray = next(
            p["spec"]
            for p in rendered.of_kind("NetworkPolicy")
            if p["metadata"]["name"].endswith("-ray")
        )
        assert ray["policyTypes"] == ["Ingress", "Egress"]
        rules = ray["egress"]
        assert rules[0] == {"to": [{"podSelector": ray["podSelector"]}]}  # all ports
        dns = rules[1]
        assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
        assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
        redis = [r for r in rules if {"protocol": "TCP", "port": 6379} in r.get("ports", [])]
        if with_redis:
            (rule,) = redis
            (peer,) = rule["to"]
            selected = {n for n, pod in labels.items() if _matches(peer["podSelector"], pod)}
            assert selected == {"redis"}
        else:
            assert redis == []
        assert rules[-1] == extra  # what the operator listed, as given
        assert all("to" in r for r in rules)  # no rule opens every destination


def test_prometheus_rule_is_the_tested_alert_file() -> None:
    rule = render(EAST, api_versions=MONITORING_APIS).one("PrometheusRule")
    alerts = yaml.safe_load((CHART_DIR / "dashboards" / "alerts.yaml").read_text(encoding="utf-8"))
    assert rule["spec"] == alerts
    text = json.dumps(rule)
    assert "{{ $labels.region }}" in text  # Prometheus' templates survive Helm untouched


def test_grafana_dashboards_are_configmaps_for_the_sidecar() -> None:
    maps = render(EAST).of_kind("ConfigMap")
    files = sorted((CHART_DIR / "dashboards").glob("*.json"))
    assert len(maps) == len(files) == 2
    for config_map, path in zip(
        sorted(maps, key=lambda m: m["metadata"]["name"]), files, strict=True
    ):
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(config_map["data"][path.name]) == json.loads(
            path.read_text(encoding="utf-8")
        )


def test_helm_test_pod_checks_the_endpoint_with_the_first_key() -> None:
    rendered = render(TWO_MODELS)
    pod = rendered.one("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[:3] == [
        "firstlight",
        "check",
        f"http://firstlight-serve-svc.{NAMESPACE}.svc:8000",
    ]
    assert command[command.index("--model") + 1] == TWO_MODELS["models"][0]["name"]
    assert (
        command[command.index("--api-key-file") + 1]
        == "/var/run/secrets/firstlight/api-keys/api-key-0"
    )


def test_notes_give_the_endpoint_and_a_curl_line() -> None:
    notes = render(EAST).notes
    assert "Endpoint: https://us-east.llm.example.com/v1" in notes
    assert "curl -s https://us-east.llm.example.com/v1/chat/completions" in notes
    assert '"model": "llama-3.1-8b-instruct-awq"' in notes
    assert "port-forward" in render().notes  # no public endpoint by default


def test_chart_versions_follow_the_package_and_the_image() -> None:
    """The chart's appVersion is the package's version (the default image tag), and the
    Ray version KubeRay is told is the one the image's base carries."""
    import re
    import tomllib

    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text(encoding="utf-8"))
    project = tomllib.loads((CHART_DIR.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert chart["appVersion"] == project["project"]["version"]
    dockerfile = (CHART_DIR.parents[1] / "Dockerfile").read_text(encoding="utf-8")
    base_versions = set(re.findall(r"^FROM rayproject/ray:([\d.]+)-", dockerfile, flags=re.M))
    assert base_versions == {load_values(CHART_DIR / "values.yaml")["rayCluster"]["rayVersion"]}
    head = render().one("RayService")["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["template"]["spec"]["containers"][0]["image"].endswith(f":{chart['appVersion']}")


def test_every_example_model_fits_a_worker_group_with_one_gpu_per_shard() -> None:
    # A 70B model that reserves four GPUs must also be split across them (and vice
    # versa): the config's check, and each GPU replica must fit one node of the cluster.
    from firstlight.config import ModelConfig

    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    checked = 0
    for path in EXAMPLES:
        values = load_values(path)
        cluster = values.get("rayCluster", {})
        groups = cluster.get("workerGroups", defaults["rayCluster"]["workerGroups"])
        for raw in values.get("models", []):
            model = ModelConfig.model_validate(raw)
            shards = model.vllm.tensor_parallel_size * model.vllm.pipeline_parallel_size
            if model.resources.num_gpus >= 1:
                assert model.resources.num_gpus == shards, (path.name, model.name)
                assert any(g.get("gpus", 0) >= model.resources.num_gpus for g in groups), (
                    f"{path.name}: {model.name} needs {model.resources.num_gpus} GPUs on a node"
                )
                checked += 1
    assert checked >= 2  # the two-models example's GPU models at least


def test_a_region_with_peers_needs_the_shared_peer_secret() -> None:
    """Without it a peer's forward could be told from a client's only by headers any
    client can send (the hole: the hop header was a client's to set)."""
    without = {**EAST, "auth": {**EAST.get("auth", {}), "peerSecret": {"existingSecret": ""}}}
    with pytest.raises(HelmRenderError, match=r"auth\.peerSecret\.existingSecret is required"):
        render(without)
    alone = render({})  # no peers: no peer key, nothing mounted
    assert "peer_secret" not in app_args(alone)["config"]["auth"]


def test_the_in_chart_store_is_valkey_and_still_runs_a_redis_image() -> None:
    """Valkey (BSD) by default; the pod runs whichever server binary the image has, so a
    Redis image set in redis.image works the same."""
    (sts,) = render().of_kind("StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("valkey/valkey:")
    assert "$(command -v valkey-server || command -v redis-server)" in container["args"][0]
    probe = container["readinessProbe"]["exec"]["command"][2]
    assert "$(command -v valkey-cli || command -v redis-cli)" in probe
    (other,) = render({"redis": {"image": {"repository": "redis", "tag": "7.4.2-alpine"}}}).of_kind(
        "StatefulSet"
    )
    assert other["spec"]["template"]["spec"]["containers"][0]["image"] == "redis:7.4.2-alpine"


def test_an_image_pinned_by_digest_runs_that_digest_in_every_ray_pod() -> None:
    digest = "sha256:" + "ab" * 32
    spec = render(
        {"image": {"repository": "registry.example/fl", "tag": "0.1.0", "digest": digest}}
    )
    cluster = spec.one("RayService")["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    images = {c["image"] for pod in pods for c in pod["template"]["spec"]["containers"]}
    assert images == {f"registry.example/fl@{digest}"}
