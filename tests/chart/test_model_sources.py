"""Models named by ``hf://`` or ``s3://`` in the chart: credentials from Secrets as
environment variables, the node cache mounted and named in each remote model's
``fetch.cache_dir``, and ``HF_HUB_OFFLINE`` on (as the image sets it) while no model
needs the hub."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest

from firstlight.config import parse_config
from tests.chart.chart import CHART_DIR, app_args, crd_validator, load_values, pod_specs, render

DEFAULTS = load_values(CHART_DIR / "values.yaml")
MOUNT = DEFAULTS["modelSources"]["cache"]["mountPath"]

_HUB_VALUES: dict[str, Any] = {
    "models": [
        {"name": "llama", "source": "hf://acme/llama-8b@0123abc"},
        {"name": "local", "source": "/models/qwen"},
    ],
    "modelSources": {
        "secretEnv": [{"name": "HF_TOKEN", "existingSecret": "firstlight-hf", "key": "token"}],
        "cache": {"mountPath": MOUNT, "hostPath": "/var/lib/firstlight-models", "sizeLimit": ""},
    },
}


def _ray_containers(values: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    specs = [spec for name, spec in pod_specs(render(values)) if name.startswith("ray-")]
    assert len(specs) >= 2  # the head (gateway) and a worker group (replicas) both fetch
    return [(spec, container) for spec in specs for container in spec["containers"]]


def test_local_models_keep_the_pods_offline_with_no_cache() -> None:
    for spec, container in _ray_containers({}):
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_HUB_OFFLINE"] == {"name": "HF_HUB_OFFLINE", "value": "1"}
        assert "model-cache" not in {v["name"] for v in spec["volumes"]}
        assert "model-cache" not in {m["name"] for m in container["volumeMounts"]}


def test_a_hub_model_gets_its_token_the_node_cache_and_the_hub() -> None:
    for spec, container in _ray_containers(_HUB_VALUES):
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_HUB_OFFLINE"] == {"name": "HF_HUB_OFFLINE", "value": "0"}  # image: 1
        assert env["HF_TOKEN"] == {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "firstlight-hf", "key": "token"}},
        }
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["model-cache"]["hostPath"] == {
            "path": "/var/lib/firstlight-models",
            "type": "DirectoryOrCreate",
        }
        assert {"name": "model-cache", "mountPath": MOUNT} in container["volumeMounts"]
    rendered = render(_HUB_VALUES)
    config = parse_config(app_args(rendered)["config"])
    remote, local = config.models
    assert remote.fetch.cache_dir is not None
    assert str(remote.fetch.cache_dir) == MOUNT
    assert str(config.model_dir(remote)).startswith(f"{MOUNT}/hf--acme--llama-8b-")
    assert local.fetch.cache_dir is None  # a local model is not fetched
    errors = list(crd_validator("RayService", strict=True).iter_errors(rendered.one("RayService")))
    assert not errors, [e.message for e in errors]


def test_an_s3_model_stays_offline_for_the_hub_and_keeps_its_own_cache_dir() -> None:
    values = {
        "models": [
            {"name": "a", "source": "s3://models/a"},
            {"name": "b", "source": "s3://models/b", "fetch": {"cache_dir": "/scratch"}},
        ],
        "modelSources": {
            "secretEnv": [
                {"name": "AWS_ACCESS_KEY_ID", "existingSecret": "s3", "key": "id"},
                {"name": "AWS_SECRET_ACCESS_KEY", "existingSecret": "s3", "key": "secret"},
            ],
            "cache": {"mountPath": MOUNT, "hostPath": "", "sizeLimit": "200Gi"},
        },
    }
    for spec, container in _ray_containers(values):
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_HUB_OFFLINE"]["value"] == "1"
        assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "s3",
            "key": "secret",
        }
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["model-cache"] == {"name": "model-cache", "emptyDir": {"sizeLimit": "200Gi"}}
    config = parse_config(app_args(render(values))["config"])
    assert [str(m.fetch.cache_dir) for m in config.models] == [MOUNT, "/scratch"]


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        (
            {"name": "HF TOKEN", "existingSecret": "hf", "key": "token"},
            "/modelSources/secretEnv/0/name",
        ),
        ({"name": "HF_TOKEN", "key": "token"}, "existingSecret"),
    ],
)
def test_a_bad_secret_env_entry_is_refused_by_the_schema(entry: dict[str, str], where: str) -> None:
    values = json.loads(json.dumps(DEFAULTS))
    values["modelSources"]["secretEnv"] = [entry]
    with helm.Chart.load(str(CHART_DIR)) as chart, pytest.raises(helm.HelmValuesError) as info:
        chart.validate_schema(values)
    assert where in str(info.value)
