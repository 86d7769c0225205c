"""Response bodies, stream chunks, SSE framing and error responses in OpenAI's shapes."""

from __future__ import annotations

import json

import pytest

from firstlight.api.responses import (
    DONE_EVENT,
    Kind,
    completion_body,
    error_body,
    error_response,
    sse_event,
    stream_chunk,
)
from firstlight.engine.protocol import Usage
from firstlight.errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    NoCapacityError,
    RateLimitedError,
)

USAGE = Usage(prompt_tokens=12, completion_tokens=5, cached_prompt_tokens=8)
USAGE_BODY = {
    "prompt_tokens": 12,
    "completion_tokens": 5,
    "total_tokens": 17,
    "prompt_tokens_details": {"cached_tokens": 8},
}


def test_chat_completion_body() -> None:
    body = completion_body("chat", "chatcmpl-1", "m", 1700, "Paris.", "stop", USAGE)
    assert body == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris."},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": USAGE_BODY,
    }


def test_text_completion_body() -> None:
    body = completion_body("text", "cmpl-1", "m", 1700, " upon a time", "length", USAGE)
    assert body == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1700,
        "model": "m",
        "choices": [
            {"index": 0, "text": " upon a time", "logprobs": None, "finish_reason": "length"}
        ],
        "usage": USAGE_BODY,
    }


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_a_body_without_usage_has_no_usage_key(kind: Kind) -> None:
    body = completion_body(kind, "id", "m", 0, "", None, None)
    assert "usage" not in body
    assert body["choices"][0]["finish_reason"] is None


def test_first_chat_chunk_carries_the_role() -> None:
    first = stream_chunk("chat", "chatcmpl-1", "m", 1700, "Pa", first=True)
    later = stream_chunk("chat", "chatcmpl-1", "m", 1700, "ris", "stop")
    assert first == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": "Pa"},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    assert later["choices"] == [
        {"index": 0, "delta": {"content": "ris"}, "logprobs": None, "finish_reason": "stop"}
    ]
    assert "usage" not in first
    assert "usage" not in later


def test_text_chunk() -> None:
    chunk = stream_chunk("text", "cmpl-1", "m", 1700, " once", first=True)
    assert chunk["object"] == "text_completion"
    assert chunk["choices"] == [
        {"index": 0, "text": " once", "logprobs": None, "finish_reason": None}
    ]


@pytest.mark.parametrize(
    ("kind", "obj"), [("chat", "chat.completion.chunk"), ("text", "text_completion")]
)
def test_usage_only_chunk_has_empty_choices(kind: Kind, obj: str) -> None:
    chunk = stream_chunk(kind, "id-1", "m", 5, None, usage=USAGE)
    assert chunk == {
        "id": "id-1",
        "object": obj,
        "created": 5,
        "model": "m",
        "choices": [],
        "usage": USAGE_BODY,
    }


def test_a_chunk_may_carry_text_and_usage() -> None:
    chunk = stream_chunk("chat", "id-1", "m", 5, "end", "stop", usage=USAGE)
    assert chunk["choices"][0]["delta"] == {"content": "end"}
    assert chunk["usage"] == USAGE_BODY


def test_sse_event_is_one_compact_data_line() -> None:
    body = {"id": "x", "choices": [{"text": "a\nb"}], "note": "ünïcode"}
    event = sse_event(body)
    assert event.startswith(b"data: {")
    assert event.endswith(b"}\n\n")
    payload = event[len(b"data: ") : -2]
    assert b"\n" not in payload, "a newline in the text must not split the event"
    assert b", " not in payload
    assert b": " not in payload
    assert json.loads(payload) == body


def test_done_event() -> None:
    assert DONE_EVENT == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            BadRequestError("temperature: too high", param="temperature"),
            {
                "message": "temperature: too high",
                "type": "invalid_request_error",
                "param": "temperature",
                "code": None,
            },
        ),
        (
            AuthenticationError("incorrect API key provided", code="invalid_api_key"),
            {
                "message": "incorrect API key provided",
                "type": "authentication_error",
                "param": None,
                "code": "invalid_api_key",
            },
        ),
        (
            ApiError("boom"),
            {"message": "boom", "type": "server_error", "param": None, "code": None},
        ),
    ],
)
def test_error_body(error: ApiError, expected: dict[str, str | None]) -> None:
    assert error_body(error) == {"error": expected}


@pytest.mark.parametrize(
    ("error", "status", "retry_after"),
    [
        (BadRequestError("bad"), 400, None),
        (AuthenticationError("who?", code="invalid_api_key"), 401, None),
        (RateLimitedError("slow down", retry_after_s=2.1), 429, "3"),
        (RateLimitedError("slow down", retry_after_s=0.2), 429, "1"),
        (RateLimitedError("slow down", retry_after_s=0.0), 429, "1"),
        (NoCapacityError("none left", retry_after_s=5.0), 503, "5"),
    ],
)
def test_error_response(error: ApiError, status: int, retry_after: str | None) -> None:
    response = error_response(error)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert json.loads(bytes(response.body)) == error_body(error)
    assert response.headers.get("retry-after") == retry_after


def test_error_response_keeps_extra_headers() -> None:
    headers = {"x-firstlight-region": "eu-west"}
    response = error_response(RateLimitedError("slow down", retry_after_s=1.5), headers)
    assert response.headers["x-firstlight-region"] == "eu-west"
    assert response.headers["retry-after"] == "2"
    assert headers == {"x-firstlight-region": "eu-west"}, "the caller's dict is not modified"
