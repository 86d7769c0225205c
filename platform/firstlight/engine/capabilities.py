"""What the vLLM engine supports on each device, checked before an engine starts.

Called by :class:`firstlight.engine.vllm_engine.VllmEngine` before it builds vLLM, so an
unsupported combination fails in a second with a message naming what *is* supported,
instead of minutes later (or never) inside vLLM.

The table follows vLLM's documentation for 0.32 (CPU backend: AWQ, GPTQ and
compressed-tensors INT8 W8A8 on x86; no FP8, no bitsandbytes, no speculative decoding)
and the measured fact that vLLM's CPU attention needs block sizes that are multiples of
32. Modes marked supported on the CPU that this project has not run itself are listed in
``docs/engines.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from firstlight.config import ModelConfig
from firstlight.errors import UnsupportedEngineConfigError

__all__ = ["CAPABILITIES", "Capability", "Device", "check_supported", "detect_device"]

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
    if problems:
        raise UnsupportedEngineConfigError(f"model {model.name!r}: " + "; ".join(problems))
