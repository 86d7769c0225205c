"""``Gateway``: the region's Ray Serve ingress deployment.

Ray builds it with the platform config, the region and one deployment handle per model
(:func:`firstlight.serve.app.region_app`), then asks it for its ASGI app
(``__serve_build_asgi_app__``, after the constructor). It adapts Ray to the gateway's
:class:`~firstlight.api.gateway.LocalBackend` (handles and their routers' state) and owns
the gateway's HTTP client and peer-probe task. The soak run (``firstlight_bench.tools.soak``)
calls its ``memory_*`` methods through a deployment handle: ``tracemalloc`` in this
process, off until asked, then on until the process ends
(:mod:`firstlight.telemetry.memory`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI
from ray.serve.handle import DeploymentHandle
from redis.asyncio import Redis

from firstlight.api.gateway import GatewayCore
from firstlight.api.limits import KeyLimits
from firstlight.api.prompts import build_encoder
from firstlight.api.routes import build_fastapi
from firstlight.api.token_quota import TokenQuota, TokenStore
from firstlight.config import HintsConfig, PlatformConfig
from firstlight.engine.protocol import GenerationChunk, GenerationRequest, OpenAICall, RenderedChunk
from firstlight.errors import FirstlightError
from firstlight.hints._redis import redis_client
from firstlight.region.registry import router_state
from firstlight.region.state import RouterState, ServedBy
from firstlight.regions.hop import HopSigner
from firstlight.regions.peers import CircuitBreaker, Peer, PeerTable
from firstlight.routing import RequestView
from firstlight.serve.keys import region_keys
from firstlight.serve.model_server import hint_key_prefix, uses_replica_port
from firstlight.serve.replica_port import (
    ReplicaPortAuthError,
    ReplicaPortClient,
    ReplicaPortError,
)
from firstlight.telemetry import GatewayTelemetry
from firstlight.telemetry.gateways import ExpositionShare
from firstlight.telemetry.logs import configure_logging
from firstlight.telemetry.memory import MemoryGrowth, MemoryProbe, MemoryStatus

__all__ = ["Gateway", "peer_table"]

_log = logging.getLogger(__name__)

_UNREACHABLE_S = 1.0
"""How long a replica port that failed to answer is passed over (Ray's own health
check replaces a dead replica within seconds; a live one answers again at once)."""


def peer_table(
    config: PlatformConfig,
    region: str,
    client: httpx.AsyncClient,
    peer_key: str,
) -> PeerTable:
    """The peers of ``region`` at their configured URLs; in local mode a peer without one
    is the peer's route prefix on the shared HTTP proxy, and the configured RTT is
    emulated (a URL there points at something in between, such as a fault injector).
    Hops are signed with ``peer_key`` (:func:`firstlight.serve.keys.region_keys`)."""
    entry = next(r for r in config.regions if r.name == region)
    peers = []
    for p in entry.peers:
        if p.url is not None:
            url = str(p.url).rstrip("/")
        else:
            host = config.gateway.host
            host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            url = f"http://{host}:{config.gateway.port}/{p.region}"
        emulated = p.rtt_ms if config.mode == "local" else 0.0
        peers.append(Peer(p.region, url, p.rtt_ms, emulated, CircuitBreaker()))
    return PeerTable(peers, client, signer=HopSigner(peer_key, region))


def _region_redis(config: PlatformConfig, region: str, what: str) -> Redis | None:
    """A client of the hints Redis for state the region's gateways share, or ``None``
    (logged) when its password reference cannot be resolved: ``what`` then stays local."""
    try:
        return redis_client(config.hints, connect_timeout_s=0.05)
    except FirstlightError as exc:
        _log.warning("region %s: %s stay local: %s", region, what, exc)
        return None


def _shared_limits(config: PlatformConfig, region: str) -> KeyLimits:
    """Per-key limits shared with the region's other gateways through the hints Redis
    (each gateway enforces them alone while Redis is unreachable)."""
    gateway = config.gateway
    client = _region_redis(config, region, "per-key limits")
    return KeyLimits(
        gateway.max_concurrent_per_key,
        gateway.max_requests_per_minute_per_key,
        client,
        key_prefix=hint_key_prefix(config, region),
    )


def _token_quota(config: PlatformConfig, region: str) -> TokenQuota:
    """The per-key token quota, shared with the region's other gateways through the
    hints Redis (``scope: region``) or with every region's through
    ``gateway.token_quota.redis_url`` (``scope: global``); this gateway's alone when that
    Redis's password reference cannot be resolved (logged)."""
    gateway = config.gateway
    settings = gateway.token_quota
    if gateway.max_tokens_per_minute_per_key is None:
        return TokenQuota.from_config(gateway)
    if settings.scope == "region":
        client = _region_redis(config, region, "token quotas")
        prefix = hint_key_prefix(config, region)
    else:
        assert settings.redis_url is not None  # the config requires it for global
        # The quota's own Redis, connected as the hints' is (only these fields are read).
        endpoint = HintsConfig(
            redis_url=settings.redis_url,
            password=settings.password,
            tls_ca_file=settings.tls_ca_file,
        )
        try:
            client = redis_client(endpoint, connect_timeout_s=settings.deadline_ms / 1000)
        except FirstlightError as exc:
            _log.warning("region %s: token quotas stay local: %s", region, exc)
            client = None
        prefix = f"{config.hints.key_prefix}global:"
    store = None if client is None else TokenStore(client, prefix)
    return TokenQuota.from_config(gateway, store)


def _gateway_id() -> str:
    """This gateway replica's Ray replica id (its ``gateway`` label in metrics)."""
    from ray import serve

    return str(serve.get_replica_context().replica_id.unique_id)


class Gateway:
    """One gateway replica of one region (see the module docstring)."""

    def __init__(
        self,
        config: dict[str, Any],
        region: str,
        handles: dict[str, DeploymentHandle[Any]],
        launcher: str | None = None,
    ) -> None:
        self._config = PlatformConfig.model_validate(config)
        configure_logging(
            self._config.telemetry.log_level,
            sink="serve-replica",
            log_format=self._config.telemetry.log_format,
        )
        self._region = region
        self._handles = handles
        for handle in handles.values():
            handle._init()  # type: ignore[no-untyped-call]  # builds the request router now, so readiness is known early
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=2.0, read=300.0, write=10.0, pool=5.0)
        )
        keys = region_keys(self._config, region, launcher)
        self._peers = peer_table(self._config, region, self._client, keys.peer)
        self._ports = ReplicaPortClient(keys.port)
        self._port_models = {
            m.name for m in self._config.models if uses_replica_port(self._config, m)
        }
        self._unreachable: dict[str, float] = {}
        """Replica ports that just failed to answer, until when (monotonic)."""
        encoders = {m.name: build_encoder(self._config, m) for m in self._config.models}
        self._telemetry = GatewayTelemetry(
            self._config,
            region,
            lambda: {name: self.state(name) for name in self._handles},
            self._peers,
        )
        self._core = GatewayCore(
            self._config,
            region,
            self,
            encoders,
            self._peers,
            self._client,
            self._telemetry,
            _shared_limits(self._config, region),
            tokens=_token_quota(self._config, region),
        )
        self._metrics = ExpositionShare(
            _gateway_id(),
            self._telemetry,
            _region_redis(self._config, region, "metrics"),
            hint_key_prefix(self._config, region),
        )
        self._core.exposition_share = self._metrics
        self._memory = MemoryProbe()  # tracemalloc: off until the soak run turns it on
        self._probe_task: asyncio.Task[None] | None = None
        self._share_task: asyncio.Task[None] | None = None
        if not self._config.auth.enabled:
            _log.warning(
                "region %s: authentication is OFF (allowed in local mode only): "
                "anyone who can reach this endpoint can use it",
                region,
            )
        with contextlib.suppress(RuntimeError):
            self._start_tasks(asyncio.get_running_loop())

    def __serve_build_asgi_app__(self) -> FastAPI:
        self._start_tasks(asyncio.get_event_loop())
        return build_fastapi(self._core)

    def _start_tasks(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._probe_task is None:
            self._probe_task = loop.create_task(self._peers.run())
        if self._share_task is None and self._telemetry.enabled:
            self._share_task = loop.create_task(self._metrics.run())

    # --- LocalBackend --------------------------------------------------------------------

    def state(self, model: str) -> RouterState | None:
        handle = self._handles[model]
        return router_state(handle.deployment_id.app_name, handle.deployment_id.name)

    async def stream(
        self,
        model: str,
        request: GenerationRequest | OpenAICall,
        routing: RequestView,
        trace_context: dict[str, str],
    ) -> AsyncIterator[ServedBy | GenerationChunk | RenderedChunk]:
        """The request's stream, by the decision recorded for it: from the chosen
        replica's own port (``gateway.data_path: replica-port``), else through the
        model's handle, whose request router executes the same decision."""
        state = self.state(model)
        port = model in self._port_models and isinstance(request, GenerationRequest)
        target = self._port_target(state, routing) if port and state is not None else None
        if target is not None and state is not None and isinstance(request, GenerationRequest):
            replica_id, address = target
            state.record_routed(routing.request_id, replica_id)
            stream = self._ports.stream(address, request, routing, trace_context)
            try:
                async with contextlib.aclosing(stream):
                    async for item in stream:
                        yield item
                return
            except ReplicaPortAuthError:
                # A replica of another build (a rolling update gave it another key): its
                # port refused before any output, so the handle path serves the request.
                _log.warning("%s: the port at %s refused this gateway's key", model, address)
                self._unreachable[address] = time.monotonic() + _UNREACHABLE_S
            except ReplicaPortError:
                self._unreachable[address] = time.monotonic() + _UNREACHABLE_S
                raise
        async for served in self._handle_stream(model, request, routing, trace_context):
            yield served

    def _port_target(self, state: RouterState, routing: RequestView) -> tuple[str, str] | None:
        """The best-ranked replica of the request's decision that serves on a port and
        did not just fail to answer there (a retry then takes the next one); ``None``
        when no replica has published a port yet (its stats have not come): the handle
        path serves it. Raises :class:`ReplicaPortError` when every published port just
        failed to answer (the replicas died: the gateway retries, then fails over, as
        it would if the handle had failed)."""
        route = state.route_of(routing.request_id)
        decision = route.decision if route is not None else state.decide(routing)
        if decision is None:
            return None
        now, published = time.monotonic(), 0
        for candidate in decision.ranked:
            stats = state.stats.get(candidate.replica_id)
            if stats is None or stats.data_address is None or not stats.accepting:
                continue
            if candidate.replica_id not in state.replicas:
                continue
            published += 1
            if self._unreachable.get(stats.data_address, 0.0) > now:
                continue
            return candidate.replica_id, stats.data_address
        if published:
            raise ReplicaPortError(
                f"none of the {published} replica ports of the decision answered just now"
            )
        return None

    async def _handle_stream(
        self,
        model: str,
        request: GenerationRequest | OpenAICall,
        routing: RequestView,
        trace_context: dict[str, str],
    ) -> AsyncIterator[ServedBy | GenerationChunk | RenderedChunk]:
        handle = self._handles[model].options(stream=True)
        response: Any = handle.generate.remote(
            request, routing=routing, trace_context=trace_context
        )
        finished = False
        try:
            async for chunk in response:
                yield chunk
            finished = True
        finally:
            if not finished:  # the client went away: stop the replica's work too
                response.cancel()

    # --- memory growth (the soak run, through a deployment handle; not an HTTP route) ---

    async def memory_start(self, frames: int) -> MemoryStatus:
        """Start ``tracemalloc`` in this gateway's process with ``frames`` frames per
        traceback (:meth:`firstlight.telemetry.memory.MemoryTracer.start`); it stays on
        until the process ends (stopping it can crash a Ray worker on Python 3.11)."""
        return await self._memory.start(frames)

    async def memory_status(self) -> MemoryStatus:
        """Whether this gateway traces, and how many bytes it has traced."""
        return await self._memory.status()

    async def memory_baseline(self, label: str) -> MemoryStatus:
        """Take the baseline ``label`` once (repeated asks are no-ops); raises
        ``RuntimeError`` when tracing is off."""
        return await self._memory.take_baseline(label)

    async def memory_growth(self, label: str, top: int) -> MemoryGrowth:
        """Traced growth since the baseline by owner, the ``top`` largest, computed once
        per ``label``; raises ``RuntimeError`` without a baseline."""
        return await self._memory.growth(label, top)

    async def __del__(self) -> None:
        for task in (self._probe_task, self._share_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._client.aclose()
        await self._ports.aclose()
        self._telemetry.shutdown()
