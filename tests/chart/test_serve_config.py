"""The RayService's ``serveConfigV2`` is a working Ray Serve config: its arguments are a
valid PlatformConfig, its import path builds the region's application, and that
application, deployed on the real local Ray cluster, serves — checked with the same
``firstlight check`` the chart's ``helm test`` pod runs."""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.serve import Application
from typer.testing import CliRunner

from firstlight.cli import app
from firstlight.config import parse_config
from tests.chart.chart import EXAMPLES, app_args, load_values, render, serve_config
from tests.serve.cluster import sim_model

CASES = [pytest.param({}, id="defaults")] + [
    pytest.param(load_values(path), id=path.name.removesuffix(".values.yaml")) for path in EXAMPLES
]


@pytest.mark.parametrize("values", CASES)
def test_serve_config_arguments_are_a_kubernetes_platform_config(values: dict[str, Any]) -> None:
    rendered = render(values)
    (application,) = serve_config(rendered)["applications"]
    region = (values.get("region") or {"name": "us-east"})["name"]
    assert application["name"] == region
    assert application["route_prefix"] == "/"
    config = parse_config(application["args"]["config"], "serveConfigV2")
    assert config.mode == "kubernetes"
    assert config.region == application["args"]["region"] == region
    assert [m.name for m in config.models] == [m["name"] for m in values.get("models", [])] or [
        "SmolLM2-135M-Instruct"
    ]


@pytest.mark.parametrize("values", CASES)
def test_import_path_builds_the_application(values: dict[str, Any]) -> None:
    (application,) = serve_config(render(values))["applications"]
    module, _, attr = application["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attr)
    built = builder(application["args"])
    assert isinstance(built, Application)


@pytest.fixture
def chart_region(serve_port: int, key_file: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The default values with a ``sim`` model, deployed from the rendered serveConfigV2.

    What differs from a cluster is only where the Secrets are: environment overrides
    (the config's documented mechanism) point the key file and Redis at this machine.
    """
    from ray import serve

    from firstlight.serve.app import build_app

    values = {"region": {"name": "chart-east", "peers": []}, "models": [sim_model("chart-sim")]}
    args = app_args(render(values))
    monkeypatch.setenv("FIRSTLIGHT__AUTH__API_KEYS__0__FILE", str(key_file))
    monkeypatch.setenv("FIRSTLIGHT__AUTH__OPERATOR_KEYS__0__FILE", str(key_file))
    monkeypatch.setenv("FIRSTLIGHT__HINTS__REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("FIRSTLIGHT__HINTS__PASSWORD", "null")
    monkeypatch.setenv("FIRSTLIGHT__HINTS__KEY_PREFIX", f"fltest.chart.{uuid.uuid4().hex[:8]}.")
    serve.run(build_app(args), name="chart-east", route_prefix="/chart-east", blocking=False)
    yield f"http://127.0.0.1:{serve_port}/chart-east"
    serve.delete("chart-east")


@pytest.mark.slow
def test_rendered_application_serves_and_passes_the_helm_test_check(
    chart_region: str, key_file: Path
) -> None:
    runner = CliRunner()
    args = ["check", chart_region, "--api-key-file", str(key_file), "--wait", "120"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["ok", "readyz"],
        ["ok", "models"],
        ["ok", "completion"],
    ]
    assert "chart-sim in region chart-east" in lines[2]
    wrong = runner.invoke(app, [*args[:4], "--model", "no-such-model"])
    assert wrong.exit_code == 1
    assert "'no-such-model' is not served" in wrong.stdout
