"""The whole platform on one machine: every region of a config in one local Ray cluster.

Called by ``firstlight up`` (which ``make up`` runs) and by the serving tests, so both
exercise the same start-up path. :func:`start_local` finds or starts Redis (without
either, hints are off and it says so), starts Ray with the configured ingress
(:mod:`firstlight.serve.data_plane`) and Serve, deploys each
region as its own application under ``/<region>``, and waits until every region's
``/readyz`` answers 200 — reporting each stage with its elapsed time, and watching Ray
Serve's status meanwhile, so a replica that fails to start (a missing model folder, an
engine that cannot start) ends the wait at once with the error's own text and where the
logs are (:mod:`firstlight.serve.startup`). :func:`stop_local` deletes the applications.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx

from firstlight._ports import listener_of
from firstlight.config import EngineName, GatewayConfig, PlatformConfig, parse_config
from firstlight.errors import FirstlightError
from firstlight.hints._redis import tls_options
from firstlight.serve.startup import (
    RayLogs,
    StartupFailure,
    error_text,
    failure_report,
    logs_line,
)
from firstlight.serve.startup_watch import StartupWatch, ray_logs

__all__ = [
    "LOCAL_DEFAULT",
    "LocalPlatform",
    "StartupCancelledError",
    "StartupError",
    "ensure_redis",
    "start_local",
    "stop_local",
    "stop_started",
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
                "tool_call_parser": "hermes",
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


_HEARTBEAT_S = 30.0
"""How often the wait for readiness says which regions it still waits for."""
_POLL_S = 0.5
_READYZ_TIMEOUT_S = 2.0
"""Per ``/readyz`` request: while a gateway starts, the ingress may hold a request
unanswered; Serve's status is read between requests, so this bounds how late a failed
replica is noticed."""


class StartupCancelledError(FirstlightError):
    """A stop was asked for (Ctrl-C, SIGTERM) while the platform was starting: raised by
    :func:`start_local` at the next stage boundary or readiness poll. What had started
    is the caller's to stop (:func:`stop_started`)."""


class StartupError(FirstlightError):
    """The local platform did not start: the gateway's port is taken, Ray Serve did not
    start, a replica failed to start (``failures`` says which, with the error's text), or
    a region's ``/readyz`` kept failing until the time-out. ``logs`` is where the Ray
    cluster's logs are, when known."""

    def __init__(
        self,
        message: str,
        failures: tuple[StartupFailure, ...] = (),
        logs: RayLogs | None = None,
    ) -> None:
        super().__init__(message)
        self.failures = failures
        self.logs = logs


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
            client = redis.Redis.from_url(
                url, password=password, socket_timeout=1.0, **tls_options(config.hints)
            )
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
    if not local:
        why = "it is not local, so it is not started here"
    elif server is None:
        why = "redis-server is not installed"
    else:
        why = "the redis-server started for it did not answer within 10 s"
    return False, f"hints: OFF - nothing answers at {url} and {why}; routing uses queue depth only"


def start_local(
    config: PlatformConfig,
    *,
    report: Report = lambda _msg: None,
    num_cpus: int | None = None,
    timeout_s: float = 600.0,
    stopping: Callable[[], bool] = lambda: False,
) -> LocalPlatform:
    """Deploy every region of ``config`` and wait until all are ready.

    ``stopping`` is asked between stages and at every readiness poll; once it says yes,
    :class:`StartupCancelledError` is raised (the CLI's Ctrl-C: a stage that blocks, such as
    Ray's start, is waited out, so a stop takes effect within one stage).

    ``report`` receives one line per stage with its elapsed time (Redis, the Ray
    cluster, deploying, each region ready), Serve's notes on slow replicas, and every
    30 s the regions still awaited. Raises ``ConfigError`` for a bad config and
    :class:`StartupError` when the gateway's port is taken, when a replica of any region
    fails to start (at Serve's first failed attempt, with the error's text and the log
    folders), or when a region is not ready within ``timeout_s`` (its last ``/readyz``
    answer is in the message).
    """
    import ray
    from ray import serve
    from ray.serve.api import RunTarget

    from firstlight.serve.app import region_app
    from firstlight.serve.data_plane import prepare_local_ray

    def check() -> None:
        if stopping():
            raise StartupCancelledError("stopped while starting")

    lap = _Laps()
    hints_enabled, note = ensure_redis(config, report)
    report(f"{note} ({lap():.1f} s)")
    check()
    targets = [
        RunTarget(region_app(config, r.name, hints_enabled=hints_enabled), r.name, f"/{r.name}")
        for r in config.regions
    ]
    started_ray = not ray.is_initialized()
    if started_ray:
        _check_port(config.gateway)
        prepare_local_ray(config.gateway)
        report(f"starting a local Ray cluster (ingress: {config.gateway.ingress})")
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    check()
    logs = ray_logs()
    try:
        serve.start(http_options={"host": config.gateway.host, "port": config.gateway.port})
    except (ray.exceptions.RayError, TimeoutError) as exc:
        raise StartupError(
            f"Ray Serve did not start:\n{_indent(error_text(str(exc)))}\n{logs_line(logs)}",
            logs=logs,
        ) from exc
    where = f"; logs in {logs.logs_dir}" if logs is not None else ""
    what = "Ray cluster started" if started_ray else "Ray Serve reached"
    report(f"{what} in {lap():.1f} s{where}")
    check()
    regions = [r.name for r in config.regions]
    watch = StartupWatch(regions, logs)
    report(f"deploying {len(targets)} region(s): {', '.join(regions)}")
    serve.run_many(targets, wait_for_applications_running=False)
    report(f"deployed in {lap():.1f} s; waiting until every region answers /readyz")
    host = "127.0.0.1" if config.gateway.host in ("0.0.0.0", "::") else config.gateway.host
    endpoints = {r.name: f"http://{host}:{config.gateway.port}/{r.name}" for r in config.regions}
    _wait_ready(endpoints, watch, report, timeout_s, check)
    return LocalPlatform(config, endpoints, hints_enabled, note)


class _Laps:
    """Seconds since the previous call (the first: since construction)."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def __call__(self) -> float:
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        return elapsed


def _check_port(gateway: GatewayConfig) -> None:
    """Raise :class:`StartupError` naming ``gateway.port`` when something already listens
    there: Ray would start, then its ingress would fail with a long traceback."""
    with socket.socket() as sock:
        # As the ingress binds: a port left in TIME_WAIT by a former run is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((gateway.host, gateway.port))
        except OSError as exc:
            holder = listener_of(gateway.port)
            who = (
                "another `firstlight up` or server is using it"
                if holder is None
                else f"process {holder[0]} holds it ({holder[1][:120]}); if that is an "
                f"ingress an earlier, killed `firstlight up` left behind: kill {holder[0]}"
            )
            raise StartupError(
                f"gateway.port: {gateway.port} on {gateway.host} is not available "
                f"({exc.strerror}); {who} - stop it "
                "or set gateway.port (FIRSTLIGHT__GATEWAY__PORT) to a free port"
            ) from exc


def _wait_ready(
    endpoints: dict[str, str],
    watch: StartupWatch,
    report: Report,
    timeout_s: float,
    check: Callable[[], None],
) -> None:
    """Poll Serve's status and each pending region's ``/readyz`` until all answer 200.
    Raises :class:`StartupError` at the first failed replica or after ``timeout_s``."""
    started = time.monotonic()
    deadline = started + timeout_s
    heartbeat = started + _HEARTBEAT_S
    pending = dict(endpoints)
    last: dict[str, str] = {}
    with httpx.Client(timeout=_READYZ_TIMEOUT_S) as client:
        while pending:
            check()
            for region, url in list(pending.items()):
                failures = watch.check(report)  # before each request: one may time out
                if failures:
                    report(f"a replica failed to start, {time.monotonic() - started:.1f} s in")
                    raise StartupError(failure_report(failures, watch.logs), failures, watch.logs)
                try:
                    answer = client.get(f"{url}/readyz")
                    last[region] = f"HTTP {answer.status_code} {answer.text[:200]}"
                    if answer.status_code == 200:
                        waited = time.monotonic() - started
                        report(f"region {region} ready after {waited:.1f} s")
                        del pending[region]
                except httpx.HTTPError as exc:
                    last[region] = f"{type(exc).__name__}"
            now = time.monotonic()
            detail = "; ".join(f"{r}: {last.get(r, 'no answer')}" for r in pending)
            if pending and now > deadline:
                message = f"not ready after {timeout_s:.0f} s: {detail}\n{logs_line(watch.logs)}"
                raise StartupError(message, logs=watch.logs)
            if pending and now >= heartbeat:
                heartbeat += _HEARTBEAT_S
                report(f"still waiting after {now - started:.0f} s: {detail}")
            if pending:
                time.sleep(_POLL_S)


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


def stop_started() -> None:
    """Stop what a cancelled :func:`start_local` had started in this process: Serve (its
    applications, proxies and HAProxy) and the local Ray cluster. Nothing when Ray is
    not running here."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


def stop_local(platform: LocalPlatform) -> None:
    """Delete the platform's applications (the Ray cluster stays for its owner): all
    are told at once, so their replicas drain side by side, then each is waited for."""
    from ray import serve

    for region in platform.endpoints:
        serve.delete(region, _blocking=False)
    for region in platform.endpoints:
        serve.delete(region)
