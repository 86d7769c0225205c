"""Which requests the gateway serves itself and which go to vLLM's own OpenAI layer.

The gateway renders responses itself for the common subset of the OpenAI API (the
fields in :data:`NATIVE_FIELDS`): that path is the fastest and resumes a stream whose
replica fails. A request using any other field — ``response_format``, ``tools``,
``logprobs``, ``n``, penalties, vLLM's extra sampling fields, message parts other than
text — is served by vLLM's OpenAI serving classes on the replica
(:mod:`firstlight.engine.vllm_openai`), so it behaves exactly as on vLLM's own server;
the gateway still parses what it routes on (:func:`routed_view`).

Called by :class:`~firstlight.api.prepare.RequestPreparer` once per request, on the
parsed JSON body. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["NATIVE_FIELDS", "extended_fields", "routed_view"]

Kind = Literal["chat", "text"]

_COMMON = frozenset(
    {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "user"}
    | {"stream_options"}
)
NATIVE_FIELDS: dict[Kind, frozenset[str]] = {
    "chat": _COMMON | {"messages", "max_completion_tokens"},
    "text": _COMMON | {"prompt"},
}
"""Top-level fields the gateway serves itself, per API."""
_NATIVE_MESSAGE = frozenset({"role", "content", "name"})
_NATIVE_STREAM_OPTIONS = frozenset({"include_usage"})


def extended_fields(kind: Kind, body: dict[str, Any]) -> tuple[str, ...]:
    """The paths (``response_format``, ``messages.1.tool_calls``) of ``body``'s fields
    outside the gateway's own subset, in body order; empty when the gateway serves it."""
    found = [key for key in body if key not in NATIVE_FIELDS[kind]]
    options = body.get("stream_options")
    if isinstance(options, dict):
        found += [f"stream_options.{k}" for k in options if k not in _NATIVE_STREAM_OPTIONS]
    messages = body.get("messages") if kind == "chat" else None
    if isinstance(messages, list):
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                continue
            found += [f"messages.{index}.{k}" for k in message if k not in _NATIVE_MESSAGE]
            content = message.get("content")
            if isinstance(content, list):
                found += [
                    f"messages.{index}.content.{i}"
                    for i, part in enumerate(content)
                    if not (isinstance(part, dict) and part.get("type") == "text")
                ]
    return tuple(found)


def routed_view(kind: Kind, body: dict[str, Any]) -> dict[str, Any]:
    """The part of an extended request the gateway parses and routes on: the native
    fields, messages reduced to their role, text and name. (The replica gets the whole
    body; this only decides the route and the prompt's block hashes.)"""
    view = {k: v for k, v in body.items() if k in NATIVE_FIELDS[kind]}
    options = view.get("stream_options")
    if isinstance(options, dict):
        view["stream_options"] = {k: v for k, v in options.items() if k in _NATIVE_STREAM_OPTIONS}
    messages = view.get("messages")
    if kind == "chat" and isinstance(messages, list):
        view["messages"] = [_routed_message(m) for m in messages]
    return view


def _routed_message(message: object) -> object:
    if not isinstance(message, dict):
        return message
    out = {k: v for k, v in message.items() if k in _NATIVE_MESSAGE}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return out
