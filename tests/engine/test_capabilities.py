"""The capability table: supported and rejected combinations, with their messages."""

from __future__ import annotations

import pytest

from firstlight.config import ModelConfig, SpeculativeConfig
from firstlight.engine.capabilities import Device, check_supported
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
