"""Request preparation (``firstlight.api.prepare``): which path a request takes, what
the engine is told the client left out, and the refusals that name their field."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from firstlight.api.prepare import OFF_LOOP_BODY_BYTES, RequestPreparer
from firstlight.api.prompts import SimPromptEncoder
from firstlight.config import parse_config
from firstlight.engine.vllm_engine import _generation_defaults
from firstlight.errors import BadRequestError, ModelNotServedError
from firstlight.prefix import HashScheme, LoraKey, hint_hashes

CONFIG = parse_config(
    {"mode": "local", "models": [{"name": "sim-m", "engine": "sim"}, {"name": "real-m"}]}, "test"
)


def _preparer() -> RequestPreparer:
    models = {m.name: m for m in CONFIG.models}
    return RequestPreparer(
        CONFIG,
        {name: SimPromptEncoder() for name in models},
        {name: HashScheme.for_model(m, CONFIG.hints) for name, m in models.items()},
    )


def _body(model: str, **fields: Any) -> bytes:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}
    ).encode()


def test_a_request_in_the_subset_is_the_gateways_own() -> None:
    prepared = _preparer().prepare("chat", _body("real-m", temperature=0.5))
    assert prepared.openai is None
    assert prepared.generation.sampling.temperature == 0.5
    assert prepared.generation.sampling.defaulted == ("top_p",)


def test_a_request_beyond_the_subset_carries_the_clients_body_to_vllms_layer() -> None:
    body = _body("real-m", logprobs=True, top_logprobs=2, max_tokens=5, stream=True)
    prepared = _preparer().prepare("chat", body, cache_salt="tenant-a")
    assert prepared.openai is not None
    assert prepared.openai.body == body
    assert prepared.openai.cache_salt == "tenant-a"
    assert prepared.openai.request_id == prepared.generation.request_id
    assert prepared.stream
    # Still routed on what the gateway parses: the prompt's tokens and hashes.
    assert prepared.routing.prompt_tokens == len(prepared.generation.prompt_token_ids) > 0
    assert prepared.generation.sampling.max_tokens == 5


def test_limits_still_apply_to_a_request_for_vllms_layer() -> None:
    with pytest.raises(BadRequestError) as caught:
        _preparer().prepare("chat", _body("real-m", logprobs=True, max_tokens=10**6))
    assert caught.value.code == "context_length_exceeded"


@pytest.mark.parametrize("name", ["n", "best_of"])
def test_choices_beyond_the_gateways_bound_are_refused_naming_the_field(name: str) -> None:
    most = CONFIG.gateway.max_choices
    assert _preparer().prepare("chat", _body("real-m", **{name: most})).openai is not None
    with pytest.raises(BadRequestError) as caught:
        _preparer().prepare("chat", _body("real-m", max_tokens=8, **{name: most + 1}))
    assert caught.value.param == name
    assert "gateway.max_choices" in str(caught.value)


def test_a_simulated_model_refuses_the_first_field_beyond_the_subset() -> None:
    with pytest.raises(BadRequestError) as caught:
        _preparer().prepare("chat", _body("sim-m", top_k=5, logprobs=True))
    assert caught.value.param == "top_k"


@pytest.mark.parametrize(
    ("diff", "expected"),
    [
        ({}, {}),
        ({"temperature": 0.6, "top_k": 20, "max_tokens": 512}, {"temperature": 0.6, "top_k": 20}),
    ],
)
def test_the_models_generation_defaults_are_its_sampling_fields(
    diff: dict[str, Any], expected: dict[str, Any]
) -> None:
    llm = SimpleNamespace(model_config=SimpleNamespace(get_diff_sampling_param=lambda: diff))
    assert _generation_defaults(llm) == expected


def test_an_adapter_is_prepared_for_its_models_replicas_with_its_own_block_hashes() -> None:
    config = parse_config(
        {"models": [{"name": "base", "lora_adapters": [{"name": "tuned", "path": "/lora/t"}]}]},
        "test",
    )
    [model] = config.models
    scheme = HashScheme.for_model(model, config.hints)
    preparer = RequestPreparer(config, {"base": SimPromptEncoder()}, {"base": scheme})
    long_chat = _body("tuned", messages=[{"role": "user", "content": "word " * 200}])
    adapted = preparer.prepare("chat", long_chat)
    plain = preparer.prepare("chat", long_chat.replace(b'"tuned"', b'"base"'))
    assert adapted.model is plain.model is model
    assert adapted.generation.lora == LoraKey("tuned", "/lora/t")
    assert plain.generation.lora is None
    assert (adapted.served_name, plain.served_name) == ("tuned", "base")
    ids = adapted.generation.prompt_token_ids
    assert ids == plain.generation.prompt_token_ids
    assert adapted.routing.block_hashes == hint_hashes(
        ids, scheme, lora=LoraKey("tuned", "/lora/t")
    )
    assert plain.routing.block_hashes == hint_hashes(ids, scheme)
    assert len(adapted.routing.block_hashes) >= 4
    assert not set(adapted.routing.block_hashes) & set(plain.routing.block_hashes)
    with pytest.raises(ModelNotServedError, match="served models: base, tuned"):
        preparer.prepare("chat", _body("other"))


EMBEDDING_CONFIG = parse_config(
    {
        "models": [
            {"name": "gen"},
            {"name": "emb", "task": "embed", "source": "/models/e", "max_model_len": 64},
        ],
        "gateway": {"max_prompt_tokens": 200},
    },
    "test",
)


def _embedding_preparer() -> RequestPreparer:
    return RequestPreparer(
        EMBEDDING_CONFIG,
        {m.name: SimPromptEncoder() for m in EMBEDDING_CONFIG.models},
        {m.name: HashScheme.for_model(m, EMBEDDING_CONFIG.hints) for m in EMBEDDING_CONFIG.models},
    )


def test_embeddings_are_routed_on_their_tokens_and_served_by_vllms_layer() -> None:
    encoder = SimPromptEncoder()
    for given, texts in [("one text", ["one text"]), (["a b", "c d e"], ["a b", "c d e"])]:
        body = json.dumps({"model": "emb", "input": given, "dimensions": 8}).encode()
        prepared = _embedding_preparer().prepare("embeddings", body, cache_salt="t")
        assert prepared.kind == "embeddings"
        assert prepared.model.name == "emb"
        assert prepared.openai is not None
        assert (prepared.openai.kind, prepared.openai.body) == ("embeddings", body)
        assert prepared.openai.cache_salt == "t"
        assert prepared.routing.prompt_tokens == sum(len(encoder.text(t)) for t in texts)
        assert prepared.routing.block_hashes == ()
        assert prepared.openai.request_id == prepared.generation.request_id
    ids = json.dumps({"model": "emb", "input": [[1, 2, 3], [4]]}).encode()
    assert _embedding_preparer().prepare("embeddings", ids).routing.prompt_tokens == 4


@pytest.mark.parametrize(
    ("kind", "body", "param", "fragment"),
    [
        ("embeddings", {"model": "gen", "input": "x"}, "model", "needs a model with task: embed"),
        (
            "chat",
            {"model": "emb", "messages": [{"role": "user", "content": "x"}]},
            "model",
            "/v1/embeddings",
        ),
        ("embeddings", {"model": "emb", "input": ""}, "input", "at least 1"),
        ("embeddings", {"model": "emb", "input": []}, "input", "at least 1 input"),
        (
            "embeddings",
            {"model": "emb", "input": "w " * 100},
            "input",
            "maximum context length is 64",
        ),
        (
            "embeddings",
            {"model": "emb", "input": ["w " * 30] * 8},
            "input",
            "gateway.max_prompt_tokens",
        ),
        (
            "embeddings",
            {"model": "emb", "input": [[1, 10**9]]},
            "input",
            "outside the model's vocabulary",
        ),
        (
            "embeddings",
            {"model": "emb", "input": ["x"] * 2049},
            "input",
            "at most 2048 are accepted",
        ),
        ("embeddings", {"model": "emb"}, "input", "required"),
    ],
)
def test_embedding_refusals_name_the_field(
    kind: Any, body: dict[str, Any], param: str, fragment: str
) -> None:
    with pytest.raises(BadRequestError) as caught:
        _embedding_preparer().prepare(kind, json.dumps(body).encode())
    assert caught.value.param == param
    assert fragment in str(caught.value)


class _Handshake(SimPromptEncoder):
    """Encodes only once the event loop has answered it: a preparation made on the
    loop's own thread would wait in vain (the loop cannot run while it waits)."""

    def __init__(self, loop_answered: threading.Event) -> None:
        self.loop_answered = loop_answered
        self.answered = False
        self.thread = ""

    def text(self, prompt: str) -> tuple[int, ...]:
        self.thread = threading.current_thread().name
        self.answered = self.loop_answered.wait(timeout=5)
        return super().text(prompt)


async def test_a_long_body_is_prepared_off_the_event_loop() -> None:
    answered = threading.Event()
    encoder = _Handshake(answered)
    models = {m.name: m for m in CONFIG.models}
    preparer = RequestPreparer(
        CONFIG,
        {name: encoder for name in models},
        {name: HashScheme.for_model(m, CONFIG.hints) for name, m in models.items()},
    )
    long_body = _body("sim-m") + b" " * OFF_LOOP_BODY_BYTES  # long in bytes, not tokens
    preparing = asyncio.ensure_future(preparer.prepare_off_loop("chat", long_body))
    await asyncio.sleep(0)  # the loop runs on while the thread encodes
    answered.set()
    prepared = await preparing
    assert encoder.answered
    assert encoder.thread.startswith("tokenize")
    assert prepared.routing.prompt_tokens == len(prepared.generation.prompt_token_ids) > 0


async def test_a_short_body_is_prepared_inline() -> None:
    encoder = _Handshake(threading.Event())
    encoder.loop_answered.set()  # inline: nothing to wait for
    models = {m.name: m for m in CONFIG.models}
    preparer = RequestPreparer(
        CONFIG,
        {name: encoder for name in models},
        {name: HashScheme.for_model(m, CONFIG.hints) for name, m in models.items()},
    )
    await preparer.prepare_off_loop("chat", _body("sim-m"))
    assert encoder.thread == threading.current_thread().name
