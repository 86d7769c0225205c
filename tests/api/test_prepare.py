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
from firstlight.api.responses import error_body
from firstlight.api.token_quota import TokenQuota
from firstlight.config import parse_config
from firstlight.engine.vllm_engine import _generation_defaults
from firstlight.errors import BadRequestError, ModelNotServedError
from firstlight.prefix import HashScheme, LoraKey, hint_hashes
from tests.conftest import FakeClock

CONFIG = parse_config(
    {"mode": "local", "models": [{"name": "sim-m", "engine": "sim"}, {"name": "real-m"}]}, "test"
)


def _preparer(encoder: SimPromptEncoder | None = None) -> RequestPreparer:
    """A preparer of ``CONFIG``; with ``encoder``, every model is tokenized by it."""
    models = {m.name: m for m in CONFIG.models}
    return RequestPreparer(
        CONFIG,
        {name: encoder or SimPromptEncoder() for name in models},
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
    for value in (1, most - 1, most):
        assert _preparer().prepare("chat", _body("real-m", **{name: value})).openai is not None
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
        assert (prepared.stream, prepared.include_usage) == (False, False)  # one JSON answer
    ids = json.dumps({"model": "emb", "input": [[1, 2, 3], [4]]}).encode()
    assert _embedding_preparer().prepare("embeddings", ids).routing.prompt_tokens == 4


async def test_an_embeddings_request_reserves_its_inputs_and_one_token() -> None:
    """An embeddings request generates nothing: its generation request only carries its
    id (vLLM's layer serves the body). The gateway's token quota still reserves prompt
    tokens plus ``max_tokens`` of it, and it asks for one token, the least any request
    asks for: inputs that leave one token of the minute's quota are admitted, and that
    one token is what is reserved beyond them."""
    body = json.dumps({"model": "emb", "input": ["a b", "c d e"]}).encode()
    prepared = _embedding_preparer().prepare("embeddings", body)
    assert prepared.generation.prompt_token_ids == ()
    encoder = SimPromptEncoder()
    inputs = len(encoder.text("a b")) + len(encoder.text("c d e"))
    assert prepared.routing.prompt_tokens == inputs
    quota = TokenQuota(inputs + 1, clock=FakeClock())
    await quota.reserve(
        "key", prepared.routing.prompt_tokens, prepared.generation.sampling.max_tokens
    )
    assert quota.used("key") == inputs + 1


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
    preparer = _preparer(encoder)
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
    preparer = _preparer(encoder)
    await preparer.prepare_off_loop("chat", _body("sim-m"))
    assert encoder.thread == threading.current_thread().name


class _Held(SimPromptEncoder):
    """Encodes once ``go`` is set, noting the thread of each call."""

    def __init__(self, go: threading.Event) -> None:
        self.go = go
        self.threads: list[str] = []

    def text(self, prompt: str) -> tuple[int, ...]:
        self.threads.append(threading.current_thread().name)
        self.go.wait(timeout=5)
        return super().text(prompt)


async def test_long_bodies_at_once_take_turns_on_the_one_tokenizer_thread() -> None:
    # A tokenizer is not used by two preparations at once: the second waits for the
    # first (held until both are submitted) instead of starting on another thread.
    go = threading.Event()
    encoder = _Held(go)
    preparer = _preparer(encoder)
    long_body = _body("sim-m") + b" " * OFF_LOOP_BODY_BYTES
    both = asyncio.gather(*(preparer.prepare_off_loop("chat", long_body) for _ in range(2)))
    await asyncio.sleep(0)  # both handed to the pool
    go.set()
    assert len(await both) == 2
    assert len(encoder.threads) == 2
    assert len(set(encoder.threads)) == 1


async def test_a_body_under_16_kib_is_prepared_inline_and_one_of_16_kib_off_the_loop() -> None:
    """The hop to the tokenizer thread costs more than a body under 16 KiB takes to
    prepare: such a body stays on the event loop, whatever its size below that."""
    go = threading.Event()
    go.set()
    encoder = _Held(go)
    preparer = _preparer(encoder)
    base = _body("sim-m")
    for size in (16 * 1024 - 1, 16 * 1024):
        padded = base + b" " * (size - len(base))  # long in bytes, not tokens
        assert len(padded) == size
        await preparer.prepare_off_loop("chat", padded)
    loop_thread = threading.current_thread().name
    assert encoder.threads[0] == loop_thread
    assert encoder.threads[1] != loop_thread
    assert encoder.threads[1].startswith("tokenize")


LIMITED = parse_config(
    {
        "models": [{"name": "m", "engine": "sim", "max_model_len": 64}],
        "gateway": {"max_messages": 3, "max_prompt_tokens": 40, "max_output_tokens": 20},
    },
    "test",
)


def _limited() -> RequestPreparer:
    [model] = LIMITED.models
    return RequestPreparer(
        LIMITED, {"m": SimPromptEncoder()}, {"m": HashScheme.for_model(model, LIMITED.hints)}
    )


def _completion(prompt: list[int] | str, **fields: Any) -> bytes:
    return json.dumps({"model": "m", "prompt": prompt, **fields}).encode()


def _refusal(kind: Any, body: bytes, preparer: RequestPreparer | None = None) -> BadRequestError:
    with pytest.raises(BadRequestError) as caught:
        (preparer or _limited()).prepare(kind, body)
    return caught.value


def test_messages_up_to_the_gateways_bound_are_accepted_and_one_more_refused() -> None:
    message = {"role": "user", "content": "x"}
    three = _limited().prepare("chat", _body("m", messages=[message] * 3))
    assert three.routing.prompt_tokens > len(SimPromptEncoder().chat([]))
    refused = _refusal("chat", _body("m", messages=[message] * 4))
    assert refused.param == "messages"
    assert "4 messages; at most 3" in str(refused)
    assert "gateway.max_messages" in str(refused)


@pytest.mark.parametrize(("kind", "param"), [("chat", "messages"), ("text", "prompt")])
def test_a_prompt_over_the_gateways_token_bound_is_refused_naming_the_prompt(
    kind: Any, param: str
) -> None:
    if kind == "chat":
        # The sim template's tokens around the content: "<user>\n", "\n", "<assistant>\n".
        overhead = len(
            _limited()
            .prepare("chat", _body("m", messages=_limited_messages("")))
            .generation.prompt_token_ids
        )
        at, over = (
            _body("m", messages=_limited_messages("x" * (40 - overhead))),
            _body("m", messages=_limited_messages("x" * (41 - overhead))),
        )
    else:
        at, over = _completion([7] * 40, max_tokens=1), _completion([7] * 41, max_tokens=1)
    assert _limited().prepare(kind, at).routing.prompt_tokens == 40
    refused = _refusal(kind, over)
    assert refused.param == param
    assert refused.code == "context_length_exceeded"
    assert "41 tokens; at most 40" in str(refused)


def _limited_messages(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def test_max_tokens_up_to_the_gateways_output_bound_is_accepted_and_one_more_refused() -> None:
    accepted = _limited().prepare("text", _completion([7] * 4, max_tokens=20))
    assert accepted.generation.sampling.max_tokens == 20
    refused = _refusal("text", _completion([7] * 4, max_tokens=21))
    assert refused.param == "max_tokens"
    assert "gateway.max_output_tokens" in str(refused)


def test_without_max_tokens_the_output_gets_the_room_left_down_to_one_token() -> None:
    wide = parse_config({"models": [{"name": "m", "engine": "sim", "max_model_len": 64}]}, "test")
    [model] = wide.models
    preparer = RequestPreparer(
        wide, {"m": SimPromptEncoder()}, {"m": HashScheme.for_model(model, wide.hints)}
    )

    def room(prompt_tokens: int) -> bytes:  # max_tokens null: the room left decides
        return _completion([7] * prompt_tokens, max_tokens=None)

    assert preparer.prepare("text", room(60)).generation.sampling.max_tokens == 4
    assert preparer.prepare("text", room(63)).generation.sampling.max_tokens == 1
    refused = _refusal("text", room(64), preparer)
    assert refused.param == "prompt"
    assert refused.code == "context_length_exceeded"
    assert "maximum context length is 64 tokens; the prompt has 64 tokens and 1 more" in str(
        refused
    )
    chat = _refusal("chat", _body("m", messages=_limited_messages("x" * 64)), preparer)
    assert chat.param == "messages"
    # The output bound caps the room: 20 tokens, not the 60 the context leaves.
    capped = _limited().prepare("text", _completion([7] * 4, max_tokens=None))
    assert capped.generation.sampling.max_tokens == 20


def test_a_requests_id_says_its_kind() -> None:
    assert _limited().prepare("chat", _body("m")).generation.request_id.startswith("chatcmpl-")
    completion = _limited().prepare("text", _completion("hi")).generation.request_id
    assert completion.startswith("cmpl-")


def test_token_ids_run_to_the_last_id_of_the_vocabulary() -> None:
    last = SimPromptEncoder.vocabulary - 1
    assert _limited().prepare("text", _completion([0, last])).routing.prompt_tokens == 2
    refused = _refusal("text", _completion([0, last + 1]))
    assert refused.param == "prompt"
    assert f"token id {last + 1} is outside the model's vocabulary (0 to {last})" in str(refused)
    assert _refusal("text", _completion([-1])).param == "prompt"


def test_a_text_model_on_the_embeddings_route_names_the_models_that_embed() -> None:
    refused = _refusal(
        "embeddings",
        json.dumps({"model": "gen", "input": "x"}).encode(),
        _embedding_preparer(),
    )
    assert "(here: emb)" in str(refused)


@pytest.mark.parametrize(
    "body",
    [b'{"model": "m", "messages": [', b"\xff\xfe", b"", b"{'model': 'm'}"],
    ids=["cut-short", "not-utf8", "empty", "single-quotes"],
)
def test_a_body_that_is_not_json_is_a_400_naming_no_field(body: bytes) -> None:
    """json's refusal (a ``ValueError``) becomes the OpenAI-shaped 400, not an error of
    the gateway's own."""
    error = error_body(_refusal("chat", body))["error"]
    assert error["message"].startswith("the body is not valid JSON: ")
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, None)


def test_a_schema_error_message_names_its_field_when_it_has_one() -> None:
    missing = _refusal("chat", json.dumps({"model": "m"}).encode())
    assert missing.param == "messages"
    assert str(missing) == "messages: Field required"
    # A body that is not an object has no field to name: pydantic's message alone.
    whole = _refusal("chat", b"[]")
    assert whole.param is None
    assert str(whole) == "Input should be a valid dictionary or instance of ChatCompletionRequest"
