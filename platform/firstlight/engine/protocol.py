"""The engine contract: what the ModelServer replica, the benchmark and tests call.

Two implementations: :mod:`firstlight.engine.vllm_engine` (vLLM ``AsyncLLM``, CPU or
GPU) and :mod:`firstlight.engine.sim` (the simulator). Who calls what, how often:

* :meth:`Engine.generate` — the ModelServer, once per request; an async iterator of
  :class:`GenerationChunk` ending with one whose ``finish_reason`` and ``usage`` are set.
  Raises :class:`~firstlight.errors.InvalidRequestError` (incl. ``PromptTooLongError``)
  before any chunk, :class:`~firstlight.errors.EngineDeadError` if the engine dies.
* :meth:`Engine.abort` — when the client goes away; frees the request's slot.
* :meth:`Engine.stats` — by the replica's ``record_routing_stats`` (every 0.1 to 1 s) and
  metrics; cheap, no I/O.
* :meth:`Engine.cache_events` — one long-lived consumer (the replica's hint publisher):
  prefix-cache blocks stored and removed, in hint form (:func:`firstlight.prefix.to_hint`).
* :meth:`Engine.shutdown` — once, when the replica drains.

Engines that also serve OpenAI requests through vLLM's own OpenAI layer implement
:class:`OpenAIServing` (the replica calls :meth:`OpenAIServing.openai` once per request
that uses a field outside the gateway's own subset, :mod:`firstlight.api.extended`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from firstlight.errors import InvalidRequestError, PromptTooLongError
from firstlight.prefix import LoraKey

__all__ = [
    "CacheEvent",
    "Engine",
    "EngineStats",
    "FinishReason",
    "GenerationChunk",
    "GenerationRequest",
    "OpenAICall",
    "OpenAIServing",
    "RenderedChunk",
    "SamplingSettings",
    "Usage",
    "check_request",
]

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """Sampling parameters the platform passes through (OpenAI's subset)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    defaulted: tuple[str, ...] = ()
    """Of ``temperature`` and ``top_p``, those the client did not send: an engine that
    knows the model's own generation defaults (vLLM reads ``generation_config.json``, as
    its server does) uses those instead."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One request, already tokenized with the model's chat template by the gateway."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSettings
    cache_salt: str | None = None
    """Per-tenant salt of the prefix cache (tenants share no cached block)."""
    lora: LoraKey | None = None
    """The LoRA adapter the client named as ``model`` (one of the model's
    ``lora_adapters``); ``None``: the model itself."""
    resumed_tokens: int = 0
    """Output tokens an earlier attempt at this request already produced (the gateway
    resumes a stream whose replica failed): the prompt ends with them, and a
    deterministic engine continues at this output position (vLLM needs nothing more;
    the simulator's filler output uses it)."""
    stream_id: str = ""
    """The id the client sees for this answer when it is not ``request_id``: a request a
    peer region forwarded keeps the forwarder's id across regions (for the client, the
    logs and a continuation's filler output), while ``request_id``, the id the engine
    gets, is always this gateway's own. Empty: ``request_id``."""

    @property
    def response_id(self) -> str:
        """The id of the answer the client sees (``stream_id``, else ``request_id``)."""
        return self.stream_id or self.request_id


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of a finished request, with OpenAI's ``cached_tokens`` detail."""

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int


@dataclass(frozen=True, slots=True)
class GenerationChunk:
    """New output since the previous chunk of the same request."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    """Set on the final chunk only."""


@dataclass(frozen=True, slots=True)
class OpenAICall:
    """A request the engine's own OpenAI layer serves: the client's JSON body as the
    gateway received it (already checked for the fields the gateway routes on)."""

    request_id: str
    kind: Literal["chat", "text", "embeddings"]
    body: bytes
    cache_salt: str | None = None
    """Per-tenant salt of the prefix cache; it replaces any ``cache_salt`` in the body."""


@dataclass(frozen=True, slots=True)
class RenderedChunk:
    """Response bytes rendered by the engine's OpenAI layer.

    A streamed request yields its server-sent events as they come (the first one with
    the first token); a JSON request yields one empty chunk when its first token exists
    (so the gateway can time it and route on it), then one chunk with the whole body.
    """

    request_id: str
    data: bytes
    finished: bool = False
    usage: Usage | None = None
    """Set on the final chunk when the engine reported usage."""
    timed: bool = True
    """False on a JSON request's empty first chunk when it does not mark the first token:
    vLLM shows a request with ``n > 1`` only when every choice is done, so its marker
    comes at once and the gateway times nothing from it (no TTFT, no calibration)."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A cheap snapshot for routing stats and metrics."""

    running: int
    waiting: int
    kv_cache_usage: float
    """Fraction of KV-cache blocks in use, 0..1."""
    prefix_cache_queries: int
    """Prompt tokens looked up in the prefix cache since start."""
    prefix_cache_hits: int
    """Of those, tokens found cached."""
    pending_prefill_tokens: int
    """Prompt tokens admitted but not yet prefilled (work ahead of a new request)."""
    prefill_tokens_per_s: float | None
    """Recent marginal prefill throughput: prompt tokens over the time they added to
    their steps, a step's fixed cost (:attr:`step_ms`) left out; ``None`` before any
    measurement."""
    inter_token_latency_ms: float | None
    """Recent mean time between output tokens of a request."""
    simulated: bool
    """True for the simulator: every number is simulated."""
    spec_draft_tokens: int = 0
    """Speculative draft tokens proposed since start (0 when speculative decoding is off)."""
    spec_accepted_tokens: int = 0
    """Of those, tokens the target model accepted."""
    step_ms: float | None = None
    """Recent mean duration of a step that only decoded: the fixed cost every step pays,
    the one that emits a first token included; ``None`` before any measurement."""
    kv_cache_blocks: int | None = None
    """KV-cache capacity in blocks (``kv_cache_usage`` is a fraction of it); ``None``
    when the engine does not say."""


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """Prefix-cache blocks the engine stored or evicted (hint form), or all cleared;
    with KV offloading, blocks that left the device for the host tier (``offloaded``)
    and blocks the host tier dropped (``offload_removed``). Applied as
    :class:`~firstlight.hints.BlockEvent` applies them: cleared, removed, offloaded,
    offload_removed, then stored (device blocks again)."""

    stored: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    cleared: bool = False
    offloaded: tuple[int, ...] = ()
    offload_removed: tuple[int, ...] = ()


class Engine(Protocol):
    """An inference engine serving one model."""

    model_name: str
    simulated: bool

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream the request's output; see the module docstring for errors."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its slot (no-op if it already finished)."""
        ...

    def stats(self) -> EngineStats:
        """Current load and cache statistics."""
        ...

    def cache_events(self) -> AsyncIterator[CacheEvent]:
        """Prefix-cache changes as they happen (one consumer)."""
        ...

    async def shutdown(self) -> None:
        """Stop the engine; pending requests end with ``EngineDeadError``."""
        ...


@runtime_checkable
class OpenAIServing(Protocol):
    """An engine that also serves whole OpenAI requests (vLLM's OpenAI layer)."""

    def openai(self, call: OpenAICall) -> AsyncIterator[RenderedChunk]:
        """Serve ``call`` as vLLM's OpenAI server would. Raises
        :class:`~firstlight.errors.InvalidRequestError` (with ``param``) before any
        chunk for a field vLLM does not know or a value it refuses, and
        :class:`~firstlight.errors.EngineDeadError` if the engine dies."""
        ...


def check_request(request: GenerationRequest, max_model_len: int) -> None:
    """Validate what every engine checks before admitting a request.

    Raises :class:`InvalidRequestError` for an empty prompt or ``max_tokens`` < 1 and
    :class:`PromptTooLongError` when prompt + ``max_tokens`` exceed ``max_model_len``.
    """
    prompt = len(request.prompt_token_ids)
    if prompt == 0:
        raise InvalidRequestError("the prompt is empty")
    max_tokens = request.sampling.max_tokens
    if max_tokens < 1:
        raise InvalidRequestError(f"max_tokens must be at least 1, got {max_tokens}")
    if prompt + max_tokens > max_model_len:
        raise PromptTooLongError(prompt, max_tokens, max_model_len)
