"""vLLM's own OpenAI layer on the real engine (the session's shared ``engine``): the
fields the gateway does not serve itself are honoured as vLLM's server honours them, a
field vLLM does not know is refused by name, and the first token and usage are seen."""

from __future__ import annotations

import json
from typing import Any

import pytest

from firstlight.engine.protocol import OpenAICall, RenderedChunk
from firstlight.engine.vllm_engine import VllmEngine
from firstlight.errors import InvalidRequestError
from tests.engine.conftest import VLLM_MODEL

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.model]

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _call(rid: str, kind: str = "chat", **body: Any) -> OpenAICall:
    if kind == "chat":
        body.setdefault("messages", [{"role": "user", "content": "Describe a person."}])
    body.setdefault("model", VLLM_MODEL.name)
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
