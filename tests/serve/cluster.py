"""Serving fixtures: one real local Ray cluster with Serve's ingress per test session,
and helpers to deploy platforms on it through the same start-up path as ``firstlight up``.

Registered for the whole test tree by the root ``conftest.py`` (``pytest_plugins``), so
the serving and the telemetry tests share one cluster. Each test module deploys its own
regions (distinct names) and deletes them at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from firstlight._ports import free_port
from firstlight.config import PlatformConfig, parse_config

API_KEY = "test-key-0123456789abcdef"


@pytest.fixture(scope="session")
def serve_port() -> Iterator[int]:
    """A local Ray cluster (2 CPUs) with the default ingress (HAProxy) on a free loopback
    port. Its node also advertises units of the gateway resource, as the chart's gateway
    pods do, so an application built from the chart's (``kubernetes`` mode) config places
    its gateways here as it would on those pods (one unit each: room for the chart's two
    and for two more); local-mode applications never ask for it."""
    import ray
    from ray import serve

    from firstlight.config import GatewayConfig
    from firstlight.serve.data_plane import prepare_local_ray
    from firstlight.serve.placement import GATEWAY_RESOURCE

    port = free_port()
    prepare_local_ray(GatewayConfig())  # the default data plane, as `firstlight up` starts it
    ray.init(
        num_cpus=2,
        resources={GATEWAY_RESOURCE: 4},
        include_dashboard=False,
        log_to_driver=False,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secrets") / "api-key"
    path.write_text(API_KEY + "\n")
    return path


def sim_model(name: str, replicas: int = 1) -> dict[str, Any]:
    """A ``sim`` model entry that fits the test machine (no CPUs reserved)."""
    return {
        "name": name,
        "engine": "sim",
        "replicas": replicas,
        "max_model_len": 4096,
        "resources": {"num_cpus": 0},
    }


def vllm_model(name: str) -> dict[str, Any]:
    """A ``vllm`` model entry of the default model that fits the test machine (float32,
    a 1 GiB KV cache, no CPUs reserved); the test adds ``cache_dir`` (its ``prepared``
    cache) to the config."""
    return {
        "name": name,
        "source": "default",
        "engine": "vllm",
        "dtype": "float32",
        "max_model_len": 2048,
        "kv_cache_gib": 1,
        "replicas": 1,
        "resources": {"num_cpus": 0},
    }


def platform_config(
    port: int,
    regions: list[dict[str, Any]],
    models: list[dict[str, Any]],
    *,
    key_file: Path | None = None,
    extra: Mapping[str, Any] | None = None,
) -> PlatformConfig:
    """A local-mode config on the session's proxy, with its own Redis key prefix."""
    data: dict[str, Any] = {
        "mode": "local",
        "regions": regions,
        "models": models,
        "hints": {"key_prefix": f"fltest:{uuid.uuid4().hex[:8]}:"},
        # One gateway per region unless a test asks for more: tests that count requests
        # in one gateway's metrics or limits stay exact (test_gateways runs several).
        "gateway": {"host": "127.0.0.1", "port": port, "replicas": 1},
    }
    if key_file is not None:
        # The test key opens the operator surfaces too (/metrics): these integration tests
        # scrape with it; the fake-gateway tests keep the two kinds of key apart.
        key = {"file": str(key_file)}
        data["auth"] = {"enabled": True, "api_keys": [key], "operator_keys": [key]}
    extra = dict(extra or {})
    data["gateway"].update(extra.pop("gateway", {}))
    data.update(extra)
    return parse_config(data, "test")
