"""``ModelServer``: the Ray Serve deployment that runs one engine replica.

Built by :mod:`firstlight.serve.app` (one deployment per model per region) and called
through a deployment handle by the gateway, via the
:class:`~firstlight.serve.request_router.FirstlightRequestRouter`:

* :meth:`generate` — once per request, streaming: yields ``GenerationChunk``s (chunks the
  engine produced while the previous item was in flight leave merged, as one Ray stream
  item: :func:`~firstlight.engine.coalesce.coalesce`), or, for an
  :class:`~firstlight.engine.protocol.OpenAICall` (a request using fields beyond the
  gateway's own subset), the ``RenderedChunk``s of vLLM's own OpenAI layer. The
  gateway passes the tokenized request and, as ``routing``, the request's
  :class:`~firstlight.routing.RequestView` (which the router read to choose us), and as
  ``trace_context`` the W3C trace context of its route span (the replica's and the
  engine's spans continue that trace when traces are exported).
* :meth:`record_routing_stats` — by Ray every ``request_routing_stats_period_s``: the
  engine's load and rates, which the router turns into a ``ReplicaView``.
* :meth:`check_health` — by Ray; fails once the engine is dead, so Ray replaces us.
* ``__del__`` — by Ray after in-flight requests finished (graceful shutdown).

In the background the replica publishes its prefix-cache blocks to Redis with its
replica id and epoch: the engine's own cache events, plus the blocks of every prompt it
prefilled (vLLM announces a block only when first stored, so a hot prefix would
otherwise expire from Redis while still resident). Redis being down costs hints, never
requests. A vLLM replica exports vLLM's own ``vllm:*`` metrics through Ray's metrics
agent and, in local mode, also relays them through the same Redis to the region's
``/metrics`` (:mod:`firstlight.telemetry.engine_metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry import trace

from firstlight.config import ModelConfig, PlatformConfig
from firstlight.engine.coalesce import coalesce
from firstlight.engine.protocol import (
    Engine,
    GenerationChunk,
    GenerationRequest,
    OpenAICall,
    OpenAIServing,
    RenderedChunk,
)
from firstlight.errors import EngineDeadError, HintsError, InvalidRequestError, StaleEpochError
from firstlight.hints import BlockEvent, HintPublisher, redis_client
from firstlight.hints._redis import OutageLog
from firstlight.region import ReplicaStats, ServedBy
from firstlight.routing import RequestView
from firstlight.serve.keys import region_keys
from firstlight.serve.replica_port import ReplicaPortServer
from firstlight.telemetry.engine_metrics import publish_engine_metrics, relays_engine_metrics
from firstlight.telemetry.logs import bind_request, configure_logging
from firstlight.telemetry.tracing import build_tracer, extract, shutdown_tracer

__all__ = ["ModelServer", "build_engine", "hint_key_prefix"]

_log = logging.getLogger(__name__)

_FLUSH_INTERVAL_S = 0.1
"""How often re-announced prompt blocks are published in one batch."""
MAX_ONGOING_REQUESTS = 256
"""Requests a replica accepts at once, through its handle and its port together: the
engine batches them continuously, so this is a safety bound, not the batch size (Ray's
default of 5 would starve the batcher)."""
DRAIN_TIMEOUT_S = 30.0
"""How long a stopping replica waits for the streams of its port (Serve waited for its
own requests already; ``graceful_shutdown_timeout_s`` is the same)."""


def uses_replica_port(config: PlatformConfig, model: ModelConfig) -> bool:
    """Whether ``model``'s replicas serve their tokens on their own port
    (``gateway.data_path``): not when Serve's autoscaler must see the load, which it
    counts at the handles only."""
    return config.gateway.data_path == "replica-port" and model.autoscaling is None


def hint_key_prefix(config: PlatformConfig, region: str) -> str:
    """Redis key prefix of one region's hints: regions are separate failure domains even
    when, in local mode, they share one Redis."""
    return f"{config.hints.key_prefix}{region}:"


def build_engine(
    config: PlatformConfig, model: ModelConfig, *, seed: int = 0, replica: bool = False
) -> Engine:
    """Start the engine ``model`` names (blocking for vLLM: tens of seconds), its
    ``hf://`` or ``s3://`` source fetched first (once per node). With ``replica`` (the
    :class:`ModelServer`'s call) vLLM's metrics go to Ray's metrics agent, and to the
    process registry only where the replica relays them
    (:func:`~firstlight.telemetry.engine_metrics.relays_engine_metrics`).

    Raises ``ModelNotFoundError`` (``ModelSourceError`` when the source cannot be
    fetched), ``UnsupportedEngineConfigError`` or ``EngineError``.
    """
    if model.engine == "sim":
        from firstlight.engine.sim import SimEngine

        return SimEngine.for_model(model, config.hints, profile=model.sim_profile, seed=seed)
    from firstlight.engine.vllm_engine import VllmEngine
    from firstlight.prefix import HashScheme
    from firstlight.sources import ensure_model_dir

    scheme = HashScheme.for_model(model, config.hints)
    return VllmEngine.create(
        model,
        ensure_model_dir(config, model),
        scheme,
        registry_metrics=not replica or relays_engine_metrics(config),
        ray_metrics=replica,
    )


class ModelServer:
    """One replica of one model in one region (see the module docstring)."""

    def __init__(
        self,
        config: dict[str, Any],
        region: str,
        model_name: str,
        hints_enabled: bool,
        launcher: str | None = None,
    ) -> None:
        self._config = PlatformConfig.model_validate(config)
        configure_logging(
            self._config.telemetry.log_level,
            sink="serve-replica",
            log_format=self._config.telemetry.log_format,
        )
        self._region = region
        self._model = next(m for m in self._config.models if m.name == model_name)
        self._replica_id = _own_replica_id()
        self._epoch = time.time_ns() // 1_000_000
        self._engine = build_engine(self._config, self._model, replica=True)
        self._hints_enabled = hints_enabled
        self._announce: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight = 0
        self._accepting = True
        self._started_at = time.time()
        self._tracer = build_tracer(self._config.telemetry, region, "replica")
        self._drained: asyncio.Event | None = None
        self._port: ReplicaPortServer | None = None
        if uses_replica_port(self._config, self._model):
            self._port = ReplicaPortServer(
                self.generate,
                lambda: self._accepting,
                lambda: self._inflight,
                MAX_ONGOING_REQUESTS,
                region_keys(self._config, region, launcher).port,
            )

    # --- called by Ray -------------------------------------------------------------------

    async def generate(
        self,
        request: GenerationRequest | OpenAICall,
        routing: RequestView | None = None,
        trace_context: dict[str, str] | None = None,
    ) -> AsyncIterator[ServedBy | GenerationChunk | RenderedChunk]:
        """Stream ``request``'s output, after a :class:`ServedBy` naming this replica.
        Raises ``InvalidRequestError`` (incl.
        ``PromptTooLongError``) before the first chunk and ``EngineDeadError`` when the
        engine dies; the gateway maps both to HTTP statuses."""
        self._ensure_tasks()
        chunks: AsyncIterator[GenerationChunk | RenderedChunk]
        if isinstance(request, OpenAICall):
            if not isinstance(self._engine, OpenAIServing):
                raise InvalidRequestError(
                    f"the {self._model.engine} engine of {self._model.name!r} serves only "
                    "the gateway's own request fields"
                )
            chunks = self._engine.openai(request)
            input_tokens = routing.prompt_tokens if routing is not None else 0
        else:
            chunks = coalesce(self._engine.generate(request))
            input_tokens = len(request.prompt_token_ids)
        self._inflight += 1
        first = True
        replica_span = self._tracer.start_span(
            "firstlight.replica",
            context=extract(trace_context),
            kind=trace.SpanKind.SERVER,
            attributes={
                "firstlight.region": self._region,
                "firstlight.replica": self._replica_id,
                "gen_ai.request.model": self._model.name,
                "gen_ai.usage.input_tokens": input_tokens,
            },
        )
        bind_request(
            request.response_id if isinstance(request, GenerationRequest) else request.request_id,
            replica_span,
        )
        engine_span = self._tracer.start_span(
            "firstlight.engine.generate",
            context=trace.set_span_in_context(replica_span),
            attributes={
                "firstlight.engine": self._model.engine,
                "firstlight.simulated": self._engine.simulated,
            },
        )
        started, output_tokens = time.monotonic(), 0
        try:
            yield ServedBy(self._replica_id)
            async for chunk in chunks:
                if first:
                    engine_span.add_event("first_token")
                    engine_span.set_attribute(
                        "firstlight.engine.ttft_s", time.monotonic() - started
                    )
                    if routing is not None and self._hints_enabled:
                        self._announce.update(routing.block_hashes)
                first = False
                if isinstance(chunk, GenerationChunk):
                    output_tokens += len(chunk.token_ids)
                elif chunk.usage is not None:
                    output_tokens = chunk.usage.completion_tokens
                yield chunk
        except (GeneratorExit, asyncio.CancelledError):
            # The gateway closed the stream (client gone, or done reading): not a failure.
            engine_span.set_attribute("firstlight.cancelled", True)
            raise
        except Exception as exc:
            engine_span.set_status(trace.StatusCode.ERROR, type(exc).__name__)
            raise
        finally:
            self._inflight -= 1
            if self._inflight == 0 and self._drained is not None:
                self._drained.set()
            engine_span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
            engine_span.end()
            replica_span.end()

    async def record_routing_stats(self) -> dict[str, Any]:
        """Load and rates for the router: a :class:`ReplicaStats` as plain data (Ray
        carries it to every router process)."""
        self._ensure_tasks()
        port = self._port
        return ReplicaStats.of_engine(
            self._engine.stats(),
            at=time.time(),
            inflight=self._inflight,
            accepting=self._accepting,
            epoch=self._epoch,
            data_address=None if port is None else port.address,
            port_streams=0 if port is None else port.counters.streams,
        ).to_wire()

    async def check_health(self) -> None:
        """Raises when the engine is dead, so Ray restarts this replica."""
        self._ensure_tasks()
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                if isinstance(exc, EngineDeadError):
                    raise exc

    async def info(self) -> dict[str, Any]:
        """Replica identity for tests and the dashboard."""
        return {
            "replica_id": self._replica_id,
            "region": self._region,
            "model": self._model.name,
            "epoch": self._epoch,
            "simulated": self._engine.simulated,
            "data_address": None if self._port is None else self._port.address,
        }

    async def __del__(self) -> None:
        """Graceful shutdown: Ray has stopped routing here and waited for the requests
        its handles carried; the port refuses new streams (gateways that have not heard
        yet try another replica) and those in flight on it finish (up to
        :data:`DRAIN_TIMEOUT_S`); then publishing stops and the engine shuts down."""
        self._accepting = False
        if self._port is not None:
            await self._port.close()
            if self._inflight:
                self._drained = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._drained.wait(), DRAIN_TIMEOUT_S)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._engine.shutdown()
        shutdown_tracer(self._tracer)

    # --- hint publishing -----------------------------------------------------------------

    def _ensure_tasks(self) -> None:
        if self._tasks:
            return
        if self._port is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._open_port()))
        if not self._engine.simulated and relays_engine_metrics(self._config):
            # vLLM's own metrics into the region's /metrics (Ray's agent has them anyway)
            self._tasks.append(asyncio.get_running_loop().create_task(self._publish_metrics()))
        if self._hints_enabled:
            self._tasks.append(asyncio.get_running_loop().create_task(self._publish_hints()))

    async def _open_port(self) -> None:
        """Listen on this node's address; the routing stats publish it once it is up."""
        assert self._port is not None
        from ray.util import get_node_ip_address

        address = await self._port.start(get_node_ip_address())  # type: ignore[no-untyped-call]
        _log.info("replica %s serves its tokens on %s", self._replica_id, address)

    async def _publish_metrics(self) -> None:
        """vLLM's ``vllm:*`` metrics to Redis (local mode):
        :mod:`firstlight.telemetry.engine_metrics`."""
        prefix = hint_key_prefix(self._config, self._region)
        await publish_engine_metrics(self._config.hints, prefix, self._region, self._replica_id)

    async def _publish_hints(self) -> None:
        """Forward engine cache events and re-announced prompt blocks to Redis."""
        client = redis_client(self._config.hints)
        publisher = HintPublisher(
            client,
            hint_key_prefix(self._config, self._region),
            self._model.name,
            self._replica_id,
            self._epoch,
            self._config.hints.ttl_s,
        )
        events: asyncio.Queue[BlockEvent] = asyncio.Queue()
        pump = asyncio.get_running_loop().create_task(self._pump_events(events))
        started = False
        outage = OutageLog(
            _log,
            f"replica {self._replica_id}: hints",
            "the routers' hint mirrors miss this replica's new blocks until it works",
        )
        try:
            while True:
                try:
                    if not started:
                        await publisher.start_epoch()
                        started = True
                    await self._flush(publisher, events)
                    outage.ok()
                except StaleEpochError:
                    _log.error("replica %s: a newer epoch exists; hints stop", self._replica_id)
                    return
                except HintsError as exc:
                    outage.failed(exc)
                await asyncio.sleep(_FLUSH_INTERVAL_S)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _pump_events(self, events: asyncio.Queue[BlockEvent]) -> None:
        async for event in self._engine.cache_events():
            events.put_nowait(
                BlockEvent(
                    self._replica_id,
                    self._epoch,
                    event.stored,
                    event.removed,
                    cleared=event.cleared,
                    offloaded=event.offloaded,
                    offload_removed=event.offload_removed,
                )
            )

    async def _flush(self, publisher: HintPublisher, events: asyncio.Queue[BlockEvent]) -> None:
        while not events.empty():
            await publisher.publish(events.get_nowait())
        if self._announce:
            stored = tuple(self._announce)
            self._announce.clear()
            await publisher.publish(BlockEvent(self._replica_id, self._epoch, stored, ()))


def _own_replica_id() -> str:
    from ray import serve

    return str(serve.get_replica_context().replica_id.unique_id)
