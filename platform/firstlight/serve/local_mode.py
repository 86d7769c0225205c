"""The whole platform on one machine: every region of a config in one local Ray cluster.

Called by ``firstlight up`` (which ``make up`` runs) and by the serving tests, so both
exercise the same start-up path. :func:`start_local` finds or starts Redis (without
either, hints are off and it says so), starts Ray with the configured ingress
(:mod:`firstlight.serve.data_plane`) and Serve, deploys each
region as its own application under ``/<region>``, and waits until every region's
``/readyz`` answers 200. :func:`stop_local` deletes the applications.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx

from firstlight.config import EngineName, PlatformConfig, parse_config
from firstlight.errors import FirstlightError

__all__ = [
    "LOCAL_DEFAULT",
    "LocalPlatform",
    "StartupError",
    "ensure_redis",
    "start_local",
    "stop_local",
    "with_engine",
]

_log = logging.getLogger(__name__)

Report = Callable[[str], None]

LOCAL_DEFAULT = parse_config(
    {
        "mode": "local",
        "regions": [
            {"name": "us-east", "peers": [{"region": "eu-west", "rtt_ms": 80}]},
            {"name": "eu-west", "peers": [{"region": "us-east", "rtt_ms": 80}]},
        ],
        "models": [
            {
                "name": "SmolLM2-135M-Instruct",
                "source": "default",
                "engine": "vllm",
                "dtype": "float32",
                "block_size": 32,
                "enforce_eager": True,
                "kv_cache_gib": 1,
                "replicas": 1,
                "resources": {"num_cpus": 0},
            }
        ],
        "router": {"policy": "firstlight", "spill_over_margin_ms": 50},
        "hints": {"key_prefix": "firstlight:local:"},
        "auth": {"enabled": False},
    },
    "firstlight up defaults",
)
"""What ``firstlight up`` runs without ``--config``: two emulated regions 80 ms apart,
one replica each of the default model on vLLM (``examples/local-two-regions.yaml``
spells out the same)."""


class StartupError(FirstlightError):
    """The local platform did not become ready (a region's ``/readyz`` kept failing)."""


@dataclass(frozen=True)
class LocalPlatform:
    """A running local platform."""

    config: PlatformConfig
    endpoints: dict[str, str]
    """Region name → base URL of its OpenAI-compatible endpoint (``.../v1`` below it)."""
    hints_enabled: bool
    hints_note: str
    """How hints are served (``redis at ...`` or why they are off)."""


def with_engine(config: PlatformConfig, engine: EngineName) -> PlatformConfig:
    """``config`` with every model on ``engine`` (``firstlight up --engine sim``)."""
    models = tuple(m.model_copy(update={"engine": engine}) for m in config.models)
    return config.model_copy(update={"models": models})


def ensure_redis(config: PlatformConfig, report: Report) -> tuple[bool, str]:
    """Use the configured Redis, or start ``redis-server`` when it is local and absent.

    Returns ``(hints_enabled, note)``; never raises for a missing Redis.
    """
    import redis

    url = config.hints.redis_url
    password = config.hints.password.resolve() if config.hints.password is not None else None

    def answers() -> bool:
        try:
            client = redis.Redis.from_url(url, password=password, socket_timeout=1.0)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except (redis.RedisError, OSError):
            return False

    if answers():
        return True, f"hints: Redis at {url}"
    parsed = urlparse(url)
    local = parsed.scheme == "redis" and parsed.hostname in ("127.0.0.1", "localhost")
    server = shutil.which("redis-server")
    if local and server is not None:
        report(f"starting redis-server on port {parsed.port or 6379}")
        subprocess.run(
            [
                server,
                "--daemonize",
                "yes",
                "--bind",
                "127.0.0.1",
                "--port",
                str(parsed.port or 6379),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            check=False,
            capture_output=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if answers():
                return True, f"hints: Redis at {url} (started by firstlight up)"
            time.sleep(0.1)
    return False, (
        f"hints: OFF - nothing answers at {url} and redis-server is not installed; "
        "routing uses queue depth only"
    )


def start_local(
    config: PlatformConfig,
    *,
    report: Report = lambda _msg: None,
    num_cpus: int | None = None,
    timeout_s: float = 600.0,
) -> LocalPlatform:
    """Deploy every region of ``config`` and wait until all are ready.

    Raises ``ConfigError`` for a bad config and :class:`StartupError` when a region is
    not ready within ``timeout_s`` (its last ``/readyz`` answer is in the message).
    """
    import ray
    from ray import serve
    from ray.serve.api import RunTarget

    from firstlight.serve.app import region_app
    from firstlight.serve.data_plane import prepare_local_ray

    hints_enabled, note = ensure_redis(config, report)
    report(note)
    targets = [
        RunTarget(region_app(config, r.name, hints_enabled=hints_enabled), r.name, f"/{r.name}")
        for r in config.regions
    ]
    if not ray.is_initialized():
        prepare_local_ray(config.gateway)
        report(f"starting a local Ray cluster (ingress: {config.gateway.ingress})")
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": config.gateway.host, "port": config.gateway.port})
    report(f"deploying {len(targets)} region(s): {', '.join(r.name for r in config.regions)}")
    serve.run_many(targets, wait_for_applications_running=False)
    host = "127.0.0.1" if config.gateway.host in ("0.0.0.0", "::") else config.gateway.host
    endpoints = {r.name: f"http://{host}:{config.gateway.port}/{r.name}" for r in config.regions}
    _wait_ready(endpoints, report, timeout_s)
    return LocalPlatform(config, endpoints, hints_enabled, note)


def _wait_ready(endpoints: dict[str, str], report: Report, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = dict(endpoints)
    last: dict[str, str] = {}
    with httpx.Client(timeout=5.0) as client:
        while pending:
            for region, url in list(pending.items()):
                try:
                    answer = client.get(f"{url}/readyz")
                    last[region] = f"HTTP {answer.status_code} {answer.text[:200]}"
                    if answer.status_code == 200:
                        report(f"region {region} is ready")
                        del pending[region]
                except httpx.HTTPError as exc:
                    last[region] = f"{type(exc).__name__}"
            if pending and time.monotonic() > deadline:
                detail = "; ".join(f"{r}: {last.get(r, 'no answer')}" for r in pending)
                raise StartupError(f"not ready after {timeout_s:.0f} s: {detail}")
            if pending:
                time.sleep(0.5)


def stop_local(platform: LocalPlatform) -> None:
    """Delete the platform's applications (the Ray cluster stays for its owner)."""
    from ray import serve

    for region in platform.endpoints:
        serve.delete(region)
