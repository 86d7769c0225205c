"""``SimEngine``: the simulator behind the :class:`~firstlight.engine.protocol.Engine`
contract, in real time on asyncio.

A background task (started by the first :meth:`SimEngine.generate`) loops: schedule a
step on the :class:`SimCore`, sleep its simulated duration (``sleep`` is injected, so
tests run without waiting), finish it, hand each request its new token, forward cache
events. Requests that arrive during a step join the next one, as in vLLM. Everything the
engine reports is simulated: ``model_name`` starts with ``sim/``, :meth:`SimEngine.stats`
has ``simulated=True``, and :meth:`SimEngine.describe` says which profile it runs.

Who calls what: the ModelServer replica (``generate``, ``abort``, ``stats``,
``shutdown``) and its hint publisher (``cache_events``), exactly as for the vLLM engine.
Use it from one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from firstlight.config import HintsConfig, ModelConfig
from firstlight.engine.coalesce import merge_chunks
from firstlight.engine.protocol import (
    CacheEvent,
    Engine,
    EngineStats,
    GenerationChunk,
    GenerationRequest,
    check_request,
)
from firstlight.engine.sim._kv import SimCacheEvent
from firstlight.engine.sim.core import SimCore
from firstlight.engine.sim.profiles import DEFAULT_PROFILE, SimProfile, get_profile
from firstlight.engine.sim.results import StepResult
from firstlight.errors import EngineDeadError, InvalidRequestError
from firstlight.prefix import HashScheme

__all__ = ["SimEngine", "Sleep"]

_log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
"""How the engine waits out a step's simulated duration (``asyncio.sleep`` by default)."""

_Item = GenerationChunk | EngineDeadError


class SimEngine:
    """A simulated replica serving one model in real time.

    ``profile`` is a :class:`SimProfile` or a registered name (unknown: ``ConfigError``);
    ``served_model_name`` (default: the profile's name) becomes ``sim/<name>``;
    ``hash_seed`` must be the platform's ``hints.hash_seed``; ``seed`` picks the filler
    text. Construct it anywhere; it starts its task on the running loop when first used.
    """

    def __init__(
        self,
        profile: SimProfile | str = DEFAULT_PROFILE,
        *,
        served_model_name: str | None = None,
        hash_seed: int = 0,
        seed: int = 0,
        sleep: Sleep = asyncio.sleep,
        stream_interval_tokens: int = 1,
    ) -> None:
        self._core = SimCore(profile, hash_seed=hash_seed, seed=seed)
        self._stream_interval = max(stream_interval_tokens, 1)
        self.simulated = True
        self.model_name = f"sim/{served_model_name or self._core.profile.name}"
        self._sleep = sleep
        self._streams: dict[str, asyncio.Queue[_Item]] = {}
        self._events: asyncio.Queue[CacheEvent | None] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._dead: str | None = None

    @classmethod
    def for_profile(
        cls,
        profile: SimProfile | str = DEFAULT_PROFILE,
        *,
        model_name: str | None = None,
        scheme: HashScheme | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        sleep: Sleep = asyncio.sleep,
        stream_interval_tokens: int = 1,
        host_kv_tokens: int | None = None,
    ) -> SimEngine:
        """The engine for ``profile`` fitted to the gateway's ``scheme``: the profile's
        costs with the scheme's block size (the KV cache keeps its size in tokens) and
        hash seed, so the engine's cache events match the gateway's hints; optionally
        another ``max_model_len`` and a host tier (KV offloading) of ``host_kv_tokens``
        tokens (``None``: the profile's; 0: none). Called by the benchmark and
        :meth:`for_model`.

        Raises :class:`~firstlight.errors.ConfigError` for an unknown profile or when the
        KV cache cannot hold one request of ``max_model_len`` tokens.
        """
        base = get_profile(profile) if isinstance(profile, str) else profile
        block_size = scheme.block_size if scheme is not None else base.block_size
        host_tokens = (
            host_kv_tokens if host_kv_tokens is not None else base.host_kv_blocks * base.block_size
        )
        fitted = replace(
            base,
            block_size=block_size,
            kv_cache_blocks=base.kv_cache_tokens // block_size,
            max_model_len=max_model_len or base.max_model_len,
            host_kv_blocks=host_tokens // block_size,
        )
        return cls(
            fitted,
            served_model_name=model_name,
            hash_seed=scheme.seed if scheme is not None else 0,
            seed=seed,
            stream_interval_tokens=stream_interval_tokens,
            sleep=sleep,
        )

    @classmethod
    def for_model(
        cls,
        model: ModelConfig,
        hints: HintsConfig,
        *,
        profile: SimProfile | str = DEFAULT_PROFILE,
        seed: int = 0,
        sleep: Sleep = asyncio.sleep,
    ) -> SimEngine:
        """The engine for ``model`` (a ``models[]`` entry with ``engine: sim``): see
        :meth:`for_profile`, with the model's name, block size, ``max_model_len``, host
        tier (``sim_host_kv_blocks``) and the platform's hash seed. Raises what
        :meth:`for_profile` raises."""
        return cls.for_profile(
            profile,
            model_name=model.name,
            scheme=HashScheme.for_model(model, hints),
            max_model_len=model.max_model_len,
            seed=seed,
            sleep=sleep,
            stream_interval_tokens=model.stream_interval_tokens,
            host_kv_tokens=model.sim_host_kv_blocks * model.block_size,
        )

    @property
    def core(self) -> SimCore:
        """The scheduler core (its true cache state, for tests)."""
        return self._core

    def describe(self) -> dict[str, Any]:
        """Model-card metadata: ``{"simulated": True, "profile": ..., ...}``."""
        return {
            "simulated": True,
            "model_name": self.model_name,
            "profile": self._core.profile.name,
            "profile_settings": asdict(self._core.profile),
            "hash_seed": self._core.scheme.seed,
            "seed": self._core.seed,
        }

    # --- Engine --------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream ``request``'s filler output, one chunk per step (with a stream interval
        of N tokens, as vLLM: the first token at once, then a chunk once N tokens have
        gathered), the last one with ``finish_reason`` and ``usage``. Raises
        ``InvalidRequestError`` (incl. ``PromptTooLongError``, or a request id already
        streaming) before any chunk and ``EngineDeadError`` once the engine is shut
        down. Closing the iterator early aborts the request."""
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        check_request(request, self._core.profile.max_model_len)
        request_id = request.request_id
        if request_id in self._streams:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._core.add(request)
        self._streams[request_id] = queue
        self._ensure_started()
        self._wake.set()
        finished = False
        held: list[GenerationChunk] = []
        sent_any = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, EngineDeadError):
                    raise item
                finished = item.finish_reason is not None
                held.append(item)
                gathered = sum(len(chunk.token_ids) for chunk in held)
                if finished or not sent_any or gathered >= self._stream_interval:
                    yield merge_chunks(held)
                    held, sent_any = [], True
                if finished:
                    return
        finally:
            if self._streams.get(request_id) is queue:
                del self._streams[request_id]
            if not finished and self._dead is None:
                self._core.abort(request_id)

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id``: its stream ends with a ``finish_reason="abort"`` chunk
        and its slot and blocks are freed. No-op when it is unknown or finished."""
        done = self._core.abort(request_id)
        queue = self._streams.get(request_id)
        if done is not None and queue is not None:
            queue.put_nowait(GenerationChunk(request_id, (), "", "abort", done.usage))

    def stats(self) -> EngineStats:
        """The core's statistics (``simulated=True``); cheap, no I/O. Until the core has
        measured a prefill rate and a step, the profile's nominal ones: the simulator
        knows its own costs, so routers need not start from a guess (a real engine has
        to measure)."""
        stats = self._core.stats()
        profile = self._core.profile
        if stats.prefill_tokens_per_s is None:
            stats = replace(stats, prefill_tokens_per_s=profile.prefill_tokens_per_s)
        if stats.step_ms is None:
            stats = replace(stats, step_ms=profile.step_ms(0, 1))
        return stats

    async def cache_events(self) -> AsyncIterator[CacheEvent]:
        """Prefix-cache changes for the one consumer: first a snapshot (``cleared`` plus
        every cached block, and with a host tier a :class:`SimCacheEvent` whose
        ``offloaded`` are the host-tier blocks), then one event per step that changed the
        cache. Ends at shutdown. Raises ``RuntimeError`` if another consumer is already
        iterating."""
        if self._events is not None:
            raise RuntimeError("cache_events() already has a consumer")
        if self._dead is not None:
            return
        queue: asyncio.Queue[CacheEvent | None] = asyncio.Queue()
        self._events = queue
        self._core.drain_cache_events()  # the snapshot below supersedes them
        stored = tuple(sorted(self._core.cache_contents()))
        host = tuple(sorted(self._core.host_contents()))
        queue.put_nowait(
            SimCacheEvent(stored=stored, cleared=True, offloaded=host)
            if host
            else CacheEvent(stored=stored, cleared=True)
        )
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            if self._events is queue:
                self._events = None

    async def shutdown(self) -> None:
        """Stop stepping; pending streams raise ``EngineDeadError``, ``cache_events``
        ends, later ``generate`` calls raise ``EngineDeadError``. Idempotent."""
        if self._dead is None:
            self._die("the simulated engine was shut down")
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    # --- internals -----------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"firstlight-sim:{self.model_name}"
            )

    async def _run(self) -> None:
        core = self._core
        try:
            while True:
                duration_s = core.begin_step()
                if duration_s is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                self._forward_events()  # evictions that made room for the step
                await self._sleep(duration_s)
                self._dispatch(core.finish_step())
                self._forward_events()  # blocks the step filled
        except Exception as exc:  # a bug in the simulator: fail every request loudly
            _log.exception("simulated engine %s failed", self.model_name)
            self._die(f"the simulated engine failed: {exc!r}")

    def _forward_events(self) -> None:
        events = self._core.drain_cache_events()  # drained even without a consumer
        if self._events is not None:
            for event in events:
                self._events.put_nowait(event)

    def _dispatch(self, result: StepResult) -> None:
        streams, text = self._streams, self._core.text
        finished = {done.request_id: done for done in result.finished}
        for request_id, token_id in result.tokens:
            queue = streams.get(request_id)
            if queue is None:
                continue
            done = finished.get(request_id) if finished else None
            if done is None:
                queue.put_nowait(GenerationChunk(request_id, (token_id,), text(token_id)))
            else:
                # A stop string is not returned (vLLM's default); its token is counted.
                shown = "" if done.finish_reason == "stop" else text(token_id)
                queue.put_nowait(
                    GenerationChunk(request_id, (token_id,), shown, done.finish_reason, done.usage)
                )

    def _die(self, reason: str) -> None:
        self._dead = reason
        for queue in self._streams.values():
            queue.put_nowait(EngineDeadError(reason))
        if self._events is not None:
            self._events.put_nowait(None)


if TYPE_CHECKING:

    def _conforms(engine: SimEngine) -> Engine:
        """mypy proves here that SimEngine implements the Engine protocol."""
        return engine
