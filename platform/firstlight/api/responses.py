"""OpenAI-shaped response bodies, stream chunks and errors.

Pure functions called by the gateway's routes. Streams are Server-Sent Events: one
``data: {json}`` event per chunk and a final ``data: [DONE]``; an error after the
stream started is sent as one ``data: {"error": ...}`` event before ``[DONE]``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from fastapi.responses import JSONResponse

from firstlight.engine.protocol import Usage
from firstlight.errors import ApiError

__all__ = [
    "DONE_EVENT",
    "Kind",
    "completion_body",
    "error_body",
    "error_response",
    "sse_event",
    "stream_chunk",
    "usage_body",
]

Kind = Literal["chat", "text", "embeddings"]
DONE_EVENT = b"data: [DONE]\n\n"


def usage_body(usage: Usage) -> dict[str, Any]:
    """OpenAI's ``usage`` with ``prompt_tokens_details.cached_tokens``."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }


def completion_body(
    kind: Kind,
    request_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None,
    usage: Usage | None,
) -> dict[str, Any]:
    """A whole (non-streamed) ``chat.completion`` or ``text_completion``."""
    choice: dict[str, Any]
    if kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if usage is not None:
        body["usage"] = usage_body(usage)
    return body


def stream_chunk(
    kind: Kind,
    request_id: str,
    model: str,
    created: int,
    text: str | None,
    finish_reason: str | None = None,
    *,
    first: bool = False,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """One streamed chunk. ``text=None`` with ``usage`` is the trailing usage-only chunk
    (``stream_options.include_usage``), whose ``choices`` is empty."""
    choices: list[dict[str, Any]] = []
    if text is not None:
        if kind == "chat":
            delta: dict[str, Any] = {"content": text}
            if first:
                delta = {"role": "assistant", "content": text}
            choices = [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ]
        else:
            choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage_body(usage)
    return body


def sse_event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def error_body(error: ApiError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.code,
        }
    }


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The HTTP response for ``error``: its status, OpenAI's body, ``Retry-After``."""
    all_headers = dict(headers or {})
    if error.retry_after_s is not None:
        all_headers["retry-after"] = str(max(1, math.ceil(error.retry_after_s)))
    return JSONResponse(error_body(error), status_code=error.status, headers=all_headers)
