"""A model's configuration as vLLM engine arguments (``firstlight.engine.vllm_args``):
every setting reaches ``AsyncEngineArgs`` under vLLM's own name, and ``kv_cache_gib``
sizes the KV cache on every device. Builds the arguments, starts no engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from firstlight.config import (
    RESERVED_ENGINE_ARGS,
    HintsConfig,
    LoraAdapter,
    ModelConfig,
    parse_config,
)
from firstlight.engine.capabilities import check_supported
from firstlight.engine.vllm_args import (
    check_engine_args,
    check_model_files,
    engine_arguments,
    engine_environment,
)
from firstlight.engine.vllm_openai import frontend_args, lora_requests
from firstlight.errors import ConfigError, ModelNotFoundError, UnsupportedEngineConfigError
from firstlight.prefix import HashScheme

GPU_MODEL = ModelConfig.model_validate(
    {
        "name": "llama-70b-fp8",
        "source": "/models/llama-70b-fp8",
        "quantization": "fp8",
        "kv_cache_gib": 40,
        "vllm": {
            "tensor_parallel_size": 4,
            "gpu_memory_utilization": 0.85,
            "max_num_seqs": 128,
            "max_num_batched_tokens": 8192,
            "enable_chunked_prefill": True,
            "kv_cache_dtype": "fp8",
            "trust_remote_code": True,
            "kv_offloading_gib": 64,
        },
        "resources": {"num_cpus": 8, "num_gpus": 4},
    }
)


def _engine_args(model: ModelConfig, device: Any) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    scheme = HashScheme.for_model(model, HintsConfig(hash_seed=0))
    kwargs = engine_arguments(model, Path("/models/m"), scheme, "bfloat16", device, "ipc://x")
    return AsyncEngineArgs(**kwargs)


def test_every_gpu_setting_reaches_async_engine_args() -> None:
    args = _engine_args(GPU_MODEL, "cuda")
    assert args.tensor_parallel_size == 4
    assert args.pipeline_parallel_size == 1
    assert args.distributed_executor_backend == "ray"
    assert args.gpu_memory_utilization == 0.85
    assert args.max_num_seqs == 128
    assert args.max_num_batched_tokens == 8192
    assert args.enable_chunked_prefill is True
    assert args.kv_cache_dtype == "fp8"
    assert args.trust_remote_code is True
    assert args.kv_offloading_size == 64
    assert args.kv_cache_memory_bytes == 40 * 2**30
    assert args.quantization == "fp8"
    assert args.served_model_name == "llama-70b-fp8"
    assert args.block_size == 32
    assert args.enable_prefix_caching is True


def test_unset_settings_keep_vllms_defaults() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = _engine_args(ModelConfig(name="m"), "cpu")
    defaults = AsyncEngineArgs(model="/models/m")
    for name in (
        "gpu_memory_utilization",
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_offloading_size",
    ):
        assert getattr(args, name) == getattr(defaults, name), name
    assert args.tensor_parallel_size == 1
    assert args.distributed_executor_backend == defaults.distributed_executor_backend
    assert args.kv_cache_memory_bytes is None


@pytest.mark.parametrize(
    ("gib", "device", "expected"),
    [(1.5, "cpu", "2"), (0.25, "cpu", "1"), (None, "cpu", None), (4, "cuda", None)],
)
def test_kv_cache_gib_on_the_cpu_is_whole_gib_of_vllm_cpu_kvcache_space(
    gib: float | None, device: Any, expected: str | None
) -> None:
    model = ModelConfig(name="m", kv_cache_gib=gib)
    assert engine_environment(model, device) == {"VLLM_CPU_KVCACHE_SPACE": expected}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"tensor_parallel_size": 2}, "vllm.tensor_parallel_size 2"),
        ({"pipeline_parallel_size": 2}, "vllm.pipeline_parallel_size 2"),
        ({"gpu_memory_utilization": 0.5}, "vllm.gpu_memory_utilization 0.5"),
        ({"kv_offloading_gib": 8}, "vllm.kv_offloading_gib 8"),
    ],
)
def test_gpu_only_settings_are_refused_on_the_cpu_by_name(
    settings: dict[str, Any], named: str
) -> None:
    parallel = settings.get("tensor_parallel_size", 1) * settings.get("pipeline_parallel_size", 1)
    model = ModelConfig.model_validate(
        {"name": "m", "vllm": settings, "resources": {"num_gpus": parallel if parallel > 1 else 0}}
    )
    with pytest.raises(UnsupportedEngineConfigError, match=named):
        check_supported(model, "cpu")
    check_supported(model, "cuda")  # the same settings are fine on a GPU


def test_lora_adapters_turn_on_vllms_lora_and_are_named_in_its_openai_layer() -> None:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    model = ModelConfig.model_validate(
        {
            "name": "m",
            "lora_adapters": [{"name": "a", "path": "/lora/a"}, {"name": "b", "path": "/l=b"}],
            "vllm": {"max_lora_rank": 32},
        }
    )
    args = _engine_args(model, "cpu")
    assert (args.enable_lora, args.max_lora_rank, args.max_loras) == (True, 32, 2)
    assert _engine_args(ModelConfig(name="m"), "cpu").enable_lora is False
    # vLLM's own parser reads the adapters, numbered as the gateway's path numbers them.
    parser = make_arg_parser(FlexibleArgumentParser())  # type: ignore[no-untyped-call]
    parsed = parser.parse_args(frontend_args(model, Path("/models/m")))
    assert [(m.name, m.path, m.base_model_name) for m in parsed.lora_modules] == [
        ("a", "/lora/a", "m"),
        ("b", "/l=b", "m"),
    ]
    requests = lora_requests(model)
    assert [(r.lora_name, r.lora_int_id, r.lora_path) for r in requests.values()] == [
        ("a", 1, "/lora/a"),
        ("b", 2, "/l=b"),
    ]


def test_a_missing_adapter_folder_is_named_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    model = ModelConfig.model_validate(
        {"name": "m", "lora_adapters": [{"name": "a", "path": str(tmp_path / "none")}]}
    )
    with pytest.raises(ModelNotFoundError, match=r"LoRA adapter .a. has no adapter_config\.json"):
        check_model_files(model, tmp_path)
    check_model_files(ModelConfig(name="m"), tmp_path)  # the model alone is there


def test_an_embedding_model_runs_vllms_pooling_runner_without_prefix_caching() -> None:
    args = _engine_args(ModelConfig(name="e", task="embed"), "cpu")
    assert (args.runner, args.enable_prefix_caching, args.kv_events_config) == (
        "pooling",
        False,
        None,
    )
    assert _engine_args(ModelConfig(name="m"), "cpu").runner == "auto"


def _with_engine_args(engine_args: dict[str, Any]) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", "vllm": {"engine_args": engine_args}})


def test_an_engine_argument_firstlight_does_not_name_reaches_vllm() -> None:
    model = _with_engine_args({"max_logprobs": "7", "async_scheduling": True})
    args = _engine_args(model, "cpu")
    assert args.max_logprobs == 7  # validated against vLLM's type: the string became 7
    assert args.async_scheduling is True


@pytest.mark.parametrize(
    ("engine_args", "key", "fragment"),
    [
        ({"max_logprob": 5}, "max_logprob", "did you mean max_logprobs"),
        ({"max_logprobs": "many"}, "max_logprobs", "vLLM's type for it refuses it"),
        ({"async_scheduling": "sometimes"}, "async_scheduling", "vLLM's type for it refuses it"),
    ],
)
def test_a_bad_engine_argument_is_refused_naming_its_key(
    engine_args: dict[str, Any], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        check_engine_args(_with_engine_args(engine_args))
    [problem] = caught.value.problems
    assert problem.path == f"vllm.engine_args.{key}"
    assert problem.value == engine_args[key]
    assert fragment in problem.message
    assert "model 'm'" in str(caught.value)


def test_every_bad_engine_argument_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        check_engine_args(_with_engine_args({"max_logprob": 5, "seedd": 1, "max_logprobs": 2}))
    assert [p.path for p in caught.value.problems] == [
        "vllm.engine_args.max_logprob",
        "vllm.engine_args.seedd",
    ]


@pytest.mark.parametrize("key", ["block_size", "max_num_seqs", "kv_events_config", "model"])
def test_an_argument_firstlight_sets_is_refused_naming_its_setting(key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"models": [{"name": "m", "vllm": {"engine_args": {key: 1}}}]}, "t")
    [problem] = caught.value.problems
    assert problem.path == f"models[0].vllm.engine_args.{key}"
    assert RESERVED_ENGINE_ARGS[key] in problem.message


def test_every_argument_firstlight_sets_is_reserved_and_is_vllms() -> None:
    """The reserved table is the arguments ``engine_arguments`` sets, all of them (a
    model with LoRA adapters, a speculative draft, tensor parallelism and every GPU
    setting), and each is a real argument of the installed vLLM."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    model = GPU_MODEL.model_copy(update={"lora_adapters": (LoraAdapter(name="a", path="/lora/a"),)})
    scheme = HashScheme.for_model(model, HintsConfig(hash_seed=0))
    kwargs = engine_arguments(model, Path("/models/m"), scheme, "bfloat16", "cuda", "ipc://x")
    embed = ModelConfig(name="e", task="embed")
    kwargs |= engine_arguments(embed, Path("/models/e"), scheme, "float32", "cpu", "ipc://x")
    assert set(kwargs) <= set(RESERVED_ENGINE_ARGS)
    vllms = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert set(RESERVED_ENGINE_ARGS) <= vllms
