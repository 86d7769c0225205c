"""Request bodies: what is refused, what is accepted, and the derived values routes use."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from firstlight.api.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    invalid_unicode_at,
)

MODEL = "SmolLM2-135M-Instruct"
USER = {"role": "user", "content": "hi"}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [USER], **fields}


def _text(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", **fields}


INVALID_CHAT = [
    ("empty-messages", _chat(messages=[]), "messages"),
    ("no-messages", {"model": MODEL}, "messages"),
    ("temperature-3", _chat(temperature=3), "temperature"),
    ("temperature-negative", _chat(temperature=-0.1), "temperature"),
    ("top-p-0", _chat(top_p=0), "top_p"),
    ("top-p-above-1", _chat(top_p=1.5), "top_p"),
    ("stop-list-of-5", _chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("stop-not-strings", _chat(stop=[1]), "stop"),
    ("bad-role", _chat(messages=[{"role": "wizard", "content": "hi"}]), "messages"),
    ("no-role", _chat(messages=[{"content": "hi"}]), "messages"),
    (
        "image-part",
        _chat(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        ),
        "messages",
    ),
    ("max-tokens-0", _chat(max_tokens=0), "max_tokens"),
    ("max-completion-tokens-0", _chat(max_completion_tokens=0), "max_completion_tokens"),
    ("empty-model", _chat(model=""), "model"),
    ("no-model", {"messages": [USER]}, "model"),
]


@pytest.mark.parametrize(
    ("body", "field"), [case[1:] for case in INVALID_CHAT], ids=[case[0] for case in INVALID_CHAT]
)
def test_invalid_chat_requests_are_refused(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(body)
    assert field in {str(error["loc"][0]) for error in caught.value.errors()}


INVALID_TEXT = [
    ("empty-prompt", _text(prompt=""), None),
    ("empty-token-list", _text(prompt=[]), "prompt"),
    ("batch-of-prompts", _text(prompt=["a", "b"]), "prompt"),
    ("batch-of-token-lists", _text(prompt=[[1, 2], [3]]), "prompt"),
    ("no-prompt", {"model": MODEL}, "prompt"),
    ("temperature-3", _text(temperature=3), "temperature"),
    ("stop-list-of-5", _text(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("max-tokens-0", _text(max_tokens=0), "max_tokens"),
]


@pytest.mark.parametrize(
    ("body", "field"), [case[1:] for case in INVALID_TEXT], ids=[case[0] for case in INVALID_TEXT]
)
def test_invalid_completion_requests_are_refused(body: dict[str, Any], field: str | None) -> None:
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate(body)
    if field is None:  # refused by a model validator, which names no field
        assert "prompt must not be empty" in str(caught.value)
    else:
        assert field in {str(error["loc"][0]) for error in caught.value.errors()}


@pytest.mark.parametrize(
    "body",
    [
        _chat(frequency_penalty=0.5),
        _chat(vendor_ext={"x": 1}),
        _chat(messages=[{"role": "assistant", "content": "x", "tool_calls": []}]),
        _chat(stream_options={"include_usage": True, "continuous_usage_stats": True}),
    ],
)
def test_fields_beyond_the_subset_are_never_dropped_silently(body: dict[str, Any]) -> None:
    # Such bodies go to vLLM's own OpenAI layer (firstlight.api.extended); the gateway's
    # own schema must never accept one and lose the field.
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ChatCompletionRequest.model_validate(body)


def test_defaults() -> None:
    chat = ChatCompletionRequest.model_validate(_chat())
    assert (chat.temperature, chat.top_p, chat.stream, chat.seed) == (1.0, 1.0, False, None)
    assert chat.requested_max_tokens is None
    assert chat.stop_sequences() == ()
    assert not chat.include_usage
    text = CompletionRequest.model_validate(_text())
    assert text.requested_max_tokens == 16


ACCEPTED_CHAT = [
    (
        "every-role",
        _chat(
            messages=[
                {"role": r, "content": "x"}
                for r in ("system", "developer", "user", "assistant", "tool")
            ]
        ),
    ),
    ("boundaries", _chat(temperature=0, top_p=1, stop=["a", "b", "c", "d"])),
    ("temperature-2", _chat(temperature=2)),
    ("null-content", _chat(messages=[{"role": "assistant", "content": None}, USER])),
    ("text-parts", _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}]}])),
]


@pytest.mark.parametrize(
    "body", [case[1] for case in ACCEPTED_CHAT], ids=[case[0] for case in ACCEPTED_CHAT]
)
def test_valid_chat_requests_are_accepted(body: dict[str, Any]) -> None:
    request = ChatCompletionRequest.model_validate(body)
    assert len(request.messages) == len(body["messages"])


def test_token_id_prompts_are_accepted() -> None:
    request = CompletionRequest.model_validate(_text(prompt=[1, 2, 3], max_tokens=None))
    assert request.prompt == [1, 2, 3]
    assert request.requested_max_tokens is None


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"max_tokens": 7}, 7),
        ({"max_completion_tokens": 9}, 9),
        ({"max_tokens": 7, "max_completion_tokens": 9}, 9),
    ],
)
def test_requested_max_tokens_prefers_the_current_name(
    fields: dict[str, Any], expected: int | None
) -> None:
    assert ChatCompletionRequest.model_validate(_chat(**fields)).requested_max_tokens == expected


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(None, ()), ("END", ("END",)), ("", ()), (["a", "", "b"], ("a", "b")), ([], ())],
)
def test_stop_sequences(stop: str | list[str] | None, expected: tuple[str, ...]) -> None:
    assert ChatCompletionRequest.model_validate(_chat(stop=stop)).stop_sequences() == expected
    assert CompletionRequest.model_validate(_text(stop=stop)).stop_sequences() == expected


@pytest.mark.parametrize(
    ("stream_options", "expected"),
    [
        (None, False),
        ({}, False),
        ({"include_usage": False}, False),
        ({"include_usage": True}, True),
    ],
)
def test_include_usage(stream_options: dict[str, Any] | None, expected: bool) -> None:
    request = ChatCompletionRequest.model_validate(
        _chat(stream=True, stream_options=stream_options)
    )
    assert request.include_usage is expected


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("plain", "plain"),
        (None, ""),
        ([], ""),
        ([{"type": "text", "text": "one "}, {"type": "text", "text": "two"}], "one two"),
    ],
)
def test_message_text_joins_parts(content: Any, expected: str) -> None:
    assert ChatMessage.model_validate({"role": "user", "content": content}).text() == expected


def test_requests_are_immutable() -> None:
    request = ChatCompletionRequest.model_validate(_chat())
    with pytest.raises(ValidationError):
        request.temperature = 0.0  # type: ignore[misc]


LONE = json.loads('"\\ud800"')


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"messages": [{"role": "user", "content": "ok"}, {"content": "a" + LONE}]}, "messages.1.content"),
        ({"messages": [{"content": [{"type": "text", "text": LONE}]}]}, "messages.0.content.0.text"),
        ({"stop": ["fine", LONE]}, "stop.1"),
        ({"messages": [{LONE: 1}]}, "messages.0"),
        ({LONE: 1}, "body"),
        (LONE, "body"),
        ({"prompt": "Köln 🚀 " + json.loads('"\\ud83d\\ude80"')}, None),
        ({"deep": [[[[["ok"]]]]], "n": 1, "x": None, "f": 1.5}, None),
    ],
)  # fmt: skip
def test_invalid_unicode_is_found_where_it_is(body: object, where: str | None) -> None:
    assert invalid_unicode_at(body) == where


def test_a_deep_body_is_walked_without_recursion() -> None:
    body: list[object] = [LONE]
    for _ in range(100_000):
        body = [body]
    assert invalid_unicode_at(body) == ".".join(["0"] * 100_001)
