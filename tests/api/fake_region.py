"""A fake region backend for in-process gateway tests: what the Ray adapter does, in
process.

:class:`FakeRegion` is a **fake** :class:`~firstlight.api.in_region.LocalBackend`. In
production :class:`firstlight.serve.gateway_deployment.Gateway` is the backend: it reads
each model's :class:`~firstlight.region.RouterState` (registered by the
:class:`~firstlight.serve.request_router.FirstlightRequestRouter` Ray builds in the
gateway's process) and streams through a Ray deployment handle, whose router ranks the
replicas and whose chosen :class:`~firstlight.serve.model_server.ModelServer` yields a
:class:`~firstlight.region.ServedBy`, then its engine's chunks. Here the same steps run
in the test's event loop, with no Ray:

* per model, a real ``RouterState`` with the configured policy
  (:func:`firstlight.routing.build_policy`) and N real :class:`SimEngine` replicas whose
  step durations are not waited out (:func:`no_wait`, or a :class:`Gate` the test opens);
* the replica views come from the engines' own stats
  (``ReplicaStats.of_engine(...).view(...)``), refreshed before every routing decision,
  as ``choose_replicas`` does;
* :meth:`FakeRegion.stream` does what Ray and the replica do per request: the decision
  the gateway committed (or, without one, ``policy.choose`` and ``record_decision``),
  ``record_routed`` (Ray sends to the first tier), then
  ``ServedBy(replica)`` and the chunks of ``engine.generate(request)``.

Deliberate differences from Ray: the prefix-cache hints are the engines' *true* cache
(:class:`~firstlight.engine.sim.TrueCacheView`, i.e. hints with no delay) instead of the
Redis-fed mirror; stats are fresh at every decision instead of up to a stats period old;
Ray's queue-length probes, ``max_ongoing_requests`` and fallback tiers are not modelled.

Test controls: a replica count per model (0: no healthy replica), :meth:`fail_next` (the
next request's replica fails before its first chunk, or after some, with the
``EngineDeadError`` a dead engine raises, and is then taken out of the replica set as
Ray does with a dead replica) and :meth:`set_backlog` (queued prefill on every replica,
for the admission bound). :func:`fake_gateway` builds a whole
:class:`~firstlight.api.gateway.GatewayCore` over a ``FakeRegion`` with an HTTP client
on its FastAPI app, and closes everything on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from firstlight.api.gateway import GatewayCore
from firstlight.api.prompts import build_encoder
from firstlight.api.routes import build_fastapi
from firstlight.api.token_quota import TokenQuota
from firstlight.config import ModelConfig, PlatformConfig, parse_config
from firstlight.engine.protocol import GenerationChunk, GenerationRequest
from firstlight.engine.sim import SimCore, SimEngine, Sleep, TrueCacheView
from firstlight.errors import EngineDeadError
from firstlight.region import ReplicaStats, RouterState, ServedBy, with_shared_rates
from firstlight.regions.hop import CallerClaim, HopSigner
from firstlight.regions.peers import CircuitBreaker, Peer, PeerTable
from firstlight.routing import NO_CACHE, RequestView, RoutingInput, build_policy
from firstlight.telemetry import GatewayTelemetry
from tests.serve.cluster import sim_model

__all__ = [
    "MODEL",
    "REGION",
    "TEST_PEER_KEY",
    "FakeGateway",
    "FakeRegion",
    "Gate",
    "fake_gateway",
    "gateway_config",
    "leaked_tasks",
    "no_wait",
    "peer_hop",
]

MODEL = "sim-chat"
TEST_PEER_KEY = "fake-regions-shared-peer-key"
"""The peer key fake regions share unless a test gives one its own."""
REGION = "fake-east"


async def no_wait(seconds: float) -> None:
    """An engine step's simulated duration, not waited out: one turn of the loop."""
    await asyncio.sleep(0)


class Gate:
    """An engine sleep that holds every step until :meth:`open` is called; ``entered``
    is set as soon as a step waits at the gate (a request is then in the engine)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self._open = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.entered.set()
        await self._open.wait()

    def open(self) -> None:
        self._open.set()


@dataclass
class _Replica:
    replica_id: str
    engine: SimEngine
    inflight: int = 0
    """Streams the replica is serving (``ModelServer._inflight``)."""


@dataclass(frozen=True)
class _Fault:
    after_chunks: int
    replica_dies: bool


@dataclass
class _Model:
    config: ModelConfig
    state: RouterState
    replicas: dict[str, _Replica] = field(default_factory=dict)
    cores: dict[str, SimCore] = field(default_factory=dict)
    """The live replicas' cores (the true cache view reads it at every lookup)."""
    measured: set[str] = field(default_factory=set)
    backlog: int = 0
    faults: deque[_Fault] = field(default_factory=deque)


class FakeRegion:
    """A fake ``LocalBackend``: what the Ray adapter does, in process (see the module
    docstring). ``replicas`` overrides ``models[].replicas`` per model name (0 allowed);
    ``sleep`` is every engine's step sleep; ``hints=False`` leaves the router without
    any cache view (``NO_CACHE``, as when Redis is off)."""

    def __init__(
        self,
        config: PlatformConfig,
        region: str,
        *,
        replicas: Mapping[str, int] | None = None,
        sleep: Sleep = no_wait,
        hints: bool = True,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.region = region
        self.served: list[tuple[str, str]] = []
        self.requests: list[GenerationRequest] = []
        """Every request a replica was sent, in order."""
        self.uncommitted = 0
        """Streams that found no committed decision and ranked the replicas themselves."""
        """(request id, replica id) of every stream, in routing order."""
        self.failed: list[tuple[str, str]] = []
        """(request id, replica id) of every injected failure."""
        self.trace_contexts: list[dict[str, str]] = []
        """The trace context each stream carried to its replica."""
        self._models: dict[str, _Model] = {}
        self._retired: list[SimEngine] = []
        for model in config.models:
            if model.engine != "sim":
                raise ValueError(f"{model.name}: the fake region runs sim models only")
            count = (replicas or {}).get(model.name, model.replicas)
            policy = build_policy(
                config.router.policy,
                config.router.params,
                rng=random.Random(seed),
                clock=time.time,
            )
            state = RouterState(region=region, model=model.name, policy=policy, clock=time.time)
            fake = _Model(model, state)
            for i in range(count):
                rid = f"{model.name}-{i}-{uuid.uuid4().hex[:6]}"
                engine = SimEngine.for_model(
                    model, config.hints, profile=model.sim_profile, sleep=sleep
                )
                fake.replicas[rid] = _Replica(rid, engine)
                fake.cores[rid] = engine.core
            if hints:
                state.cache = TrueCacheView(fake.cores)
            self._models[model.name] = fake
            self.refresh(model.name)

    # --- LocalBackend --------------------------------------------------------------------

    def state(self, model: str) -> RouterState | None:
        return self._models[model].state

    async def stream(
        self,
        model: str,
        request: GenerationRequest,
        routing: RequestView,
        trace_context: dict[str, str],
    ) -> AsyncIterator[ServedBy | GenerationChunk]:
        fake = self._models[model]
        state = fake.state
        self.trace_contexts.append(trace_context)
        # FirstlightRequestRouter.choose_replicas: fresh views, the policy, the decision.
        self.refresh(model)
        if not state.replicas:
            # Ray would hold the request until a replica starts (bounded only by the
            # gateway's first_token_timeout_s); the fake fails the attempt at once.
            raise RuntimeError(f"{model}: stream() called with no replica in the region")
        route = state.route_of(routing.request_id)
        if route is not None and route.chosen is None:
            decision = route.decision  # the gateway committed its ticket: executed as is
        else:
            self.uncommitted += 1
            started = time.perf_counter()
            decision = state.policy.choose(
                RoutingInput(routing, tuple(state.replicas.values()), state.cache or NO_CACHE)
            )
            state.record_decision(routing, decision, time.perf_counter() - started)
        # Ray sends the request to the first tier; on_request_routed.
        replica = fake.replicas[decision.winner.replica_id]
        state.record_routed(routing.request_id, replica.replica_id)
        self.served.append((request.request_id, replica.replica_id))
        self.requests.append(request)
        fault = fake.faults.popleft() if fake.faults else None
        # ModelServer.generate: ServedBy first, then the engine's chunks.
        replica.inflight += 1
        try:
            yield ServedBy(replica.replica_id)
            if fault is not None and fault.after_chunks == 0:
                raise await self._fail(fake, replica, request.request_id, fault)
            sent, failing = 0, False
            chunks = replica.engine.generate(request)
            assert isinstance(chunks, AsyncGenerator)  # closed below, as Ray's cancel does
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    yield chunk
                    sent += 1
                    if fault is not None and sent >= fault.after_chunks:
                        failing = chunk.finish_reason is None  # else: it ended first
                        break
            if fault is not None and failing:
                raise await self._fail(fake, replica, request.request_id, fault)
        finally:
            replica.inflight -= 1

    # --- test controls -------------------------------------------------------------------

    def replica_ids(self, model: str) -> list[str]:
        """The live replicas of ``model``, in creation order."""
        return list(self._models[model].replicas)

    def engine(self, model: str, replica_id: str) -> SimEngine:
        return self._models[model].replicas[replica_id].engine

    def fail_next(
        self, model: str, *, after_chunks: int = 0, replica_dies: bool = True, count: int = 1
    ) -> None:
        """The next ``count`` requests of ``model`` fail on the replica they are routed
        to, after ``after_chunks`` chunks (0: before the first), with ``EngineDeadError``.
        With ``replica_dies`` the replica then leaves the replica set and its engine
        stops, as when Ray sees a replica die (``on_replica_actor_died``)."""
        for _ in range(count):
            self._models[model].faults.append(_Fault(after_chunks, replica_dies))

    def set_backlog(self, model: str, tokens: int) -> None:
        """Report ``tokens`` of queued prefill on every replica of ``model`` on top of
        its engine's own (a region under load), from now on."""
        self._models[model].backlog = tokens
        self.refresh(model)

    def refresh(self, model: str) -> None:
        """The replicas' routing stats reach the router
        (``ModelServer.record_routing_stats`` → ``FirstlightRequestRouter._refresh_views``)."""
        fake = self._models[model]
        state = fake.state
        now = time.time()
        stats: dict[str, ReplicaStats] = {}
        views = {}
        for rid, replica in fake.replicas.items():
            record = ReplicaStats.of_engine(
                replica.engine.stats(), at=now, inflight=replica.inflight
            )
            if fake.backlog:
                pending = (record.pending_prefill_tokens or 0) + fake.backlog
                record = replace(record, pending_prefill_tokens=pending)
            stats[rid] = record
            views[rid] = record.view(rid, self.region, None)
            if views[rid].prefill_tokens_per_s and rid not in fake.measured:
                fake.measured.add(rid)
                state.policy.on_replica_reset(rid)
        state.stats = stats
        state.set_replicas(with_shared_rates(views))

    async def aclose(self) -> None:
        """Shut every engine down (their stepping tasks end)."""
        engines = [r.engine for m in self._models.values() for r in m.replicas.values()]
        for engine in [*engines, *self._retired]:
            await engine.shutdown()

    async def _fail(
        self, fake: _Model, replica: _Replica, request_id: str, fault: _Fault
    ) -> EngineDeadError:
        rid = replica.replica_id
        self.failed.append((request_id, rid))
        if fault.replica_dies and rid in fake.replicas:
            del fake.replicas[rid]
            del fake.cores[rid]
            self.refresh(fake.config.name)
            self._retired.append(replica.engine)
            await replica.engine.shutdown()
        return EngineDeadError(f"replica {rid} failed (injected by the test)")


# --- a whole gateway over the fake region ---------------------------------------------


def gateway_config(
    *,
    region: str = REGION,
    replicas: int = 2,
    key_file: Path | None = None,
    gateway: Mapping[str, Any] | None = None,
    router: Mapping[str, Any] | None = None,
    model: Mapping[str, Any] | None = None,
    auth: Mapping[str, Any] | None = None,
) -> PlatformConfig:
    """A local-mode config of one region (``region``, no peers) serving one ``sim``
    model (:data:`MODEL`), with its own Redis key prefix; ``gateway``, ``router`` and
    ``model`` are merged into their sections, ``key_file`` turns auth on (``auth``: the
    whole section instead)."""
    data: dict[str, Any] = {
        "mode": "local",
        "regions": [{"name": region}],
        "models": [{**sim_model(MODEL, replicas), **(model or {})}],
        "hints": {"key_prefix": f"fltest:{uuid.uuid4().hex[:8]}:"},
        "gateway": {"host": "127.0.0.1", **(gateway or {})},
        "router": dict(router or {}),
    }
    if key_file is not None:
        data["auth"] = {"enabled": True, "api_keys": [{"file": str(key_file)}]}
    if auth is not None:
        data["auth"] = dict(auth)
    return parse_config(data, "test")


@dataclass(frozen=True)
class FakeGateway:
    """A gateway over a :class:`FakeRegion`; ``client`` speaks HTTP to its FastAPI app in
    process (base URL ``http://gw``)."""

    config: PlatformConfig
    backend: FakeRegion
    core: GatewayCore
    client: httpx.AsyncClient
    app: FastAPI

    @property
    def region(self) -> str:
        return self.backend.region


@contextlib.asynccontextmanager
async def fake_gateway(
    config: PlatformConfig,
    *,
    replicas: Mapping[str, int] | None = None,
    sleep: Sleep = no_wait,
    hints: bool = True,
    peers: Sequence[FakeGateway] = (),
    peer_key: str = TEST_PEER_KEY,
    tokens: TokenQuota | None = None,
) -> AsyncIterator[FakeGateway]:
    """The gateway the Ray ingress deployment would build
    (``Gateway.__init__``), over a :class:`FakeRegion` instead of Ray handles, with
    per-key limits local to it (``tokens``: a token quota of the test's instead) and
    ``peers`` as its peer regions (other fake gateways, reached in process at
    ``http://<region>``, each probed once for its summary; no probe loop runs). Its hops are signed with ``peer_key`` (every fake region shares
    :data:`TEST_PEER_KEY` unless a test gives one another). Closes the HTTP clients, the
    telemetry and the engines on exit."""
    region = config.region or config.regions[0].name
    async with contextlib.AsyncExitStack() as stack:
        backend = FakeRegion(config, region, replicas=replicas, sleep=sleep, hints=hints)
        stack.push_async_callback(backend.aclose)
        mounts = {f"http://{p.region}": httpx.ASGITransport(app=p.app) for p in peers}
        peer_client = await stack.enter_async_context(
            httpx.AsyncClient(trust_env=False, mounts=mounts)
        )
        breaker = functools.partial(CircuitBreaker, failures=3, cooldown_s=10.0)
        table = [Peer(p.region, f"http://{p.region}", 10.0, 0.0, breaker()) for p in peers]
        peers_table = PeerTable(table, peer_client, signer=HopSigner(peer_key, region))
        for peer in table:
            await peers_table.probe(peer)
            assert peer.last_error is None, peer.last_error
        telemetry = GatewayTelemetry(
            config,
            region,
            lambda: {m.name: backend.state(m.name) for m in config.models},
            peers_table,
        )
        stack.callback(telemetry.shutdown)
        encoders = {m.name: build_encoder(config, m) for m in config.models}
        core = GatewayCore(
            config, region, backend, encoders, peers_table, peer_client, telemetry, tokens=tokens
        )
        app = build_fastapi(core)
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
        )
        yield FakeGateway(config, backend, core, client, app)


def peer_hop(
    payload: Mapping[str, Any],
    *,
    sender: str = "east",
    path: str = "/v1/chat/completions",
    request_id: str | None = None,
    key: str = TEST_PEER_KEY,
    caller: CallerClaim | None = None,
) -> dict[str, Any]:
    """``client.post`` keyword arguments that send ``payload`` as a peer region's signed
    hop (what :class:`~firstlight.api.forward.PeerForwarder` sends), signed with ``key``."""
    body = json.dumps(payload).encode()
    headers = {"content-type": "application/json"}
    signer = HopSigner(key, sender)
    headers.update(signer.sign(path, body, request_id=request_id, caller=caller))
    return {"content": body, "headers": headers}


def leaked_tasks() -> list[asyncio.Task[Any]]:
    """The running loop's tasks other than the current one (none should outlive a test)."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
