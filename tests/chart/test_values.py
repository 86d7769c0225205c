"""values.schema.json: generated from PlatformConfig, rejecting bad values with messages
that name them; the chart's config defaults are the config's; and a config file maps
onto values (``firstlight config to-helm-values``) and back through the chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from typer.testing import CliRunner

from firstlight.cli import app
from firstlight.config import DynamicContextSettings, PlatformConfig, load_config, parse_config
from firstlight.errors import ConfigError
from firstlight.k8s.helm_values import to_helm_values
from firstlight.k8s.values_schema import CHART_OWNED_FIELDS, CONFIG_SECTIONS, values_schema
from tests.chart.chart import CHART_DIR, REPO, app_args, load_values, render

DEFAULTS = load_values(CHART_DIR / "values.yaml")


def _rejection(values: dict[str, Any]) -> str:
    with helm.Chart.load(str(CHART_DIR)) as chart, pytest.raises(helm.HelmValuesError) as info:
        chart.validate_schema(values)
    return str(info.value)


def _with(**sections: Any) -> dict[str, Any]:
    values = json.loads(json.dumps(DEFAULTS))
    values.update(sections)
    return values


def test_committed_schema_is_the_generated_one() -> None:
    committed = json.loads((CHART_DIR / "values.schema.json").read_text(encoding="utf-8"))
    assert committed == values_schema(), "run `make helm-schema` and commit the result"


def test_defaults_pass_the_schema() -> None:
    with helm.Chart.load(str(CHART_DIR)) as chart:
        chart.validate_schema(DEFAULTS)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            _with(models=[{"name": "m", "replicas": -1}]),
            ["/models/0/replicas", "got -1"],
        ),
        (
            _with(models=[{"name": "m", "quantization": "int3"}]),
            ["/models/0/quantization", "'int3'", "awq", "gptq", "fp8"],
        ),
        (
            _with(region={"name": "us-east", "peers": [{"region": "eu-west", "rtt_ms": 80}]}),
            ["/region/peers/0", "missing property 'url'"],
        ),
        (_with(router={"policy": "fastest"}), ["/router/policy", "'fastest'"]),
        (_with(modelz=[]), ["additional properties 'modelz'"]),
        (_with(auth={"enabled": False, "apiKeys": DEFAULTS["auth"]["apiKeys"]}), ["/auth/enabled"]),
        (_with(ingress={"enabled": True}), ["/ingress/host"]),
        (_with(redis={"enabled": False}), ["/externalRedis/url"]),
        (_with(externalRedis={"url": "rediss://user:secret@host:6379/0"}), ["/externalRedis/url"]),
        (
            _with(rayCluster={**DEFAULTS["rayCluster"], "workerGroups": [{"name": "g"}]}),
            ["/rayCluster/workerGroups/0", "minReplicas"],
        ),
    ],
    ids=[
        "negative-replicas",
        "unknown-quantization",
        "peer-without-url",
        "unknown-policy",
        "unknown-section",
        "auth-off",
        "ingress-without-host",
        "no-redis-at-all",
        "credentials-in-redis-url",
        "worker-group-without-bounds",
    ],
)
def test_schema_rejects_bad_values_naming_them(values: dict[str, Any], expected: list[str]) -> None:
    message = _rejection(values)
    for part in expected:
        assert part in message, message


def test_install_with_bad_values_fails_before_rendering() -> None:
    with pytest.raises(helm.HelmValuesError, match="got -1"):
        render({"models": [{"name": "m", "replicas": -1}]})


def test_chart_config_defaults_are_the_config_defaults() -> None:
    """values.yaml spells out the config sections; each default must be PlatformConfig's,
    or a chart install would behave differently from a config file."""
    config = PlatformConfig()
    for section in ("router", "telemetry"):
        assert DEFAULTS[section] == getattr(config, section).model_dump(mode="json"), section
    for section in ("hints", "gateway"):
        expected = getattr(config, section).model_dump(
            mode="json", exclude=set(CHART_OWNED_FIELDS[section])
        )
        assert DEFAULTS[section] == expected, section
    (model,) = DEFAULTS["models"]
    defaults = parse_config({"models": [{"name": model["name"]}]}).models[0]
    shown = defaults.model_dump(mode="json")
    for field, value in model.items():
        if field != "resources":
            assert value == shown[field], field
    assert set(CONFIG_SECTIONS) <= set(DEFAULTS)


@pytest.mark.parametrize(
    "config_file",
    [REPO / "examples/kubernetes-us-east.yaml", REPO / "examples/local-two-regions.yaml"],
    ids=lambda p: p.name,
)
def test_config_survives_the_round_trip_through_the_chart(config_file: Path) -> None:
    config = load_config(config_file, environ={})
    region = config.region or config.regions[0].name
    if config_file.name.startswith("local"):
        # A local config's peers have no URLs; give them some, as an operator would.
        regions = [
            {
                **r.model_dump(mode="json"),
                "peers": [
                    {**p.model_dump(mode="json"), "url": f"https://{p.region}.llm.example.com"}
                    for p in r.peers
                ],
            }
            for r in config.regions
        ]
        config = parse_config({**config.model_dump(mode="json"), "regions": regions})
    values = to_helm_values(config, region).values
    back = parse_config(app_args(render(values))["config"])
    assert back.mode == "kubernetes"
    assert back.region == region
    for section in ("models", "router", "telemetry"):
        assert getattr(back, section) == getattr(config, section), section
    ours = next(r for r in config.regions if r.name == region)
    assert back.regions[0] == ours
    assert {r.name for r in back.regions} == {region, *(p.region for p in ours.peers)}
    assert back.hints.model_dump(exclude=set(CHART_OWNED_FIELDS["hints"])) == (
        config.hints.model_dump(exclude=set(CHART_OWNED_FIELDS["hints"]))
    )
    assert back.gateway.model_dump(exclude={"host", "port"}) == (
        config.gateway.model_dump(exclude={"host", "port"})
    )
    if config.hints.redis_url != PlatformConfig().hints.redis_url:
        assert back.hints.redis_url == config.hints.redis_url
    assert len(back.auth.api_keys) == max(1, len(config.auth.api_keys))


def test_to_helm_values_needs_peer_urls_and_a_known_region() -> None:
    config = load_config(REPO / "examples/local-two-regions.yaml", environ={})
    with pytest.raises(ConfigError, match=r"regions\[0\]\.peers\[0\]\.url"):
        to_helm_values(config, config.regions[0].name)
    with pytest.raises(ConfigError, match="'nowhere'"):
        to_helm_values(config, "nowhere")
    with pytest.raises(ConfigError, match="pass --region"):
        to_helm_values(config)


def test_cli_prints_values_the_chart_accepts() -> None:
    result = CliRunner().invoke(
        app, ["config", "to-helm-values", str(REPO / "examples/kubernetes-us-east.yaml")]
    )
    assert result.exit_code == 0, result.output
    values = yaml.safe_load(result.stdout)
    assert values["region"]["name"] == "us-east"
    assert values["externalRedis"]["url"] == "rediss://redis.firstlight.svc:6380/0"
    assert "kubectl create secret generic firstlight-api-keys" in result.stderr
    render(values)  # passes the schema and renders


def test_cli_reports_a_config_without_peer_urls() -> None:
    result = CliRunner().invoke(
        app,
        [
            "config",
            "to-helm-values",
            str(REPO / "examples/local-two-regions.yaml"),
            "--region",
            "us-east",
        ],
    )
    assert result.exit_code == 2
    assert "peers[0].url" in result.stderr


def test_tenants_reach_the_application_config() -> None:
    values = _with(
        auth={
            "enabled": True,
            "apiKeys": {
                "existingSecret": "keys",
                "keys": ["api-key-0", "api-key-1"],
                "tenants": {"api-key-1": "globex"},
                "dynamicContext": {"api-key-0": {"default_budget_tokens": 700}},
            },
            "tenant_isolation": True,
        }
    )
    auth = parse_config(app_args(render(values))["config"]).auth
    assert [key.tenant for key in auth.api_keys] == [None, "globex"]
    contexts = [key.dynamic_context for key in auth.api_keys]
    assert contexts == [DynamicContextSettings(default_budget_tokens=700), None]
    assert auth.tenant_isolation is True
    assert auth.isolates_tenants
    default = parse_config(app_args(render({}))["config"]).auth
    assert default.tenant_isolation is None
    assert not default.isolates_tenants


def test_to_helm_values_carries_tenants() -> None:
    config = load_config(REPO / "examples/kubernetes-us-east.yaml", environ={})
    keys = [{"file": "/k/a", "tenant": "acme"}, {"file": "/k/b", "dynamic_context": {}}]
    config = parse_config(
        {
            **config.model_dump(mode="json"),
            "auth": {"enabled": True, "api_keys": keys, "peer_secret": {"file": "/k/peer"}},
        }
    )
    values = to_helm_values(config).values
    assert values["auth"]["apiKeys"]["tenants"] == {"api-key-0": "acme"}
    assert values["auth"]["apiKeys"]["dynamicContext"] == {"api-key-1": {}}
    back = parse_config(app_args(render(values))["config"]).auth
    assert [key.tenant for key in back.api_keys] == ["acme", None]
    assert [key.dynamic_context for key in back.api_keys] == [None, DynamicContextSettings()]


def test_an_umbrella_charts_global_values_pass_the_schema() -> None:
    """As a subchart, the chart receives the parent's ``global`` section: a schema that
    refuses unknown keys must take that one (it failed before)."""
    with helm.Chart.load(str(CHART_DIR)) as chart:
        chart.validate_schema(_with(**{"global": {"imageRegistry": "registry.example"}}))
    assert "globals" in _rejection(_with(**{"globals": {}})), "other unknown keys still fail"


def test_an_image_digest_that_is_not_sha256_is_refused_naming_it() -> None:
    assert "/image/digest" in _rejection(_with(image={"repository": "fl", "digest": "latest"}))
