"""Continuing a stream in another region: what a peer gateway sends and reads back.

A stream can be continued in a peer region in two cases (both carried out by
:class:`~firstlight.api.in_region.LocalServer`'s resume loop, with the peer reached
through :class:`~firstlight.api.forward.PeerForwarder`):

* a local stream whose replica failed while the region has no healthy replica left (or
  whose local attempts ran out): the peer continues it;
* a stream this gateway forwarded to a peer that broke off after text went out: this
  region continues it (or the next peer does, when no replica is left here).

The forwarding gateway sends the client's request body again, plus the output tokens
already sent in :data:`RESUME_FIELD` (only on a forwarded request, which carries the hop
header; a client may not send it). The peer prepares the body exactly as the first region
did (same chat template, same tokenizer), appends those tokens
(:func:`firstlight.api.migration.continuation`) and streams the rest; with greedy
decoding the continuation is the text an uninterrupted run would have produced. On every
forwarded stream the peer adds each chunk's token ids in :data:`TOKENS_FIELD`, so the
forwarding gateway always knows exactly which tokens the client has: it strips the field
before the client sees the chunk (:func:`peer_chunks` turns the peer's events into
:class:`~firstlight.engine.protocol.GenerationChunk` s, which the resume loop writes as
its own events, under one response id).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx

from firstlight.api.in_region import TOKENS_FIELD, Prepared
from firstlight.api.migration import continuation
from firstlight.api.responses import Kind
from firstlight.api.sse import sse_events
from firstlight.engine.protocol import FinishReason, GenerationChunk, Usage
from firstlight.errors import BadRequestError
from firstlight.prefix import HashScheme
from firstlight.regions import hop
from firstlight.regions.peers import Peer, while_answering

__all__ = [
    "REQUEST_ID_HEADER",
    "RESUME_FIELD",
    "TOKENS_FIELD",
    "PeerStreamError",
    "adopt_stream_id",
    "peer_chunks",
    "resume_body",
    "resumed",
    "take_resume",
]

RESUME_FIELD = "firstlight_resume"
"""Body field of a forwarded request that continues a stream: ``{"token_ids": [...]}``,
the output tokens the client already received."""

REQUEST_ID_HEADER = hop.REQUEST_ID_HEADER
"""Header of every forwarded request, signed with the hop: the forwarding gateway's
response id, which the peer answers under, so that one stream keeps one id across
regions and a continuation continues the same output (the simulator's filler output
keys on it). The peer's engine never gets it: it gets the peer gateway's own id
(:attr:`~firstlight.engine.GenerationRequest.stream_id`). Never adopted from a request
whose hop signature did not verify."""

_REQUEST_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class PeerStreamError(Exception):
    """A peer's stream broke off or ended in an error event; the resume loop treats it as
    a failed attempt, and continues the stream elsewhere when ``resumable`` (the peer
    sent every chunk's token ids; a peer of an older version does not)."""

    def __init__(self, message: str, *, resumable: bool = True) -> None:
        super().__init__(message)
        self.resumable = resumable


def take_resume(body: bytes, *, from_peer: bool) -> tuple[bytes, tuple[int, ...] | None]:
    """``body`` without :data:`RESUME_FIELD`, and the token ids it carried (``None``
    when it carried none). Called by the gateway before preparing a request. Raises
    :class:`~firstlight.errors.BadRequestError` naming the field when a client (not a
    peer gateway) sends it or its value is not a list of token ids."""
    if RESUME_FIELD.encode() not in body:
        return body, None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body, None  # the preparer names the problem
    if not isinstance(data, dict) or RESUME_FIELD not in data:
        return body, None
    if not from_peer:
        raise BadRequestError(
            f"{RESUME_FIELD}: only a peer region's gateway may continue a stream",
            param=RESUME_FIELD,
        )
    value = data.pop(RESUME_FIELD)
    ids = value.get("token_ids") if isinstance(value, dict) else None
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        raise BadRequestError(
            f"{RESUME_FIELD}.token_ids: expected a list of token ids",
            param=f"{RESUME_FIELD}.token_ids",
        )
    return json.dumps(data).encode(), tuple(ids)


def resumed(
    prepared: Prepared,
    token_ids: tuple[int, ...],
    scheme: HashScheme,
    vocabulary: int,
    max_prompt_tokens: int | None = None,
) -> Prepared:
    """``prepared`` continued after ``token_ids`` (the peer's side of a resume). The
    continuation's prompt is the prompt and those tokens, and it is what the engine
    prefills: it counts against ``max_prompt_tokens`` (``gateway.max_prompt_tokens``).
    Raises :class:`~firstlight.errors.BadRequestError` for ids outside the vocabulary,
    for a request vLLM's OpenAI layer serves, for a continuation over the prompt bound,
    or when no output token would be left."""
    param = f"{RESUME_FIELD}.token_ids"
    total = prepared.routing.prompt_tokens + len(token_ids)
    if max_prompt_tokens is not None and total > max_prompt_tokens:
        raise BadRequestError(
            f"{param}: the prompt and the {len(token_ids)} tokens already sent make "
            f"{total} tokens; at most {max_prompt_tokens} are accepted "
            "(gateway.max_prompt_tokens)",
            param=param,
            code="context_length_exceeded",
        )
    if prepared.openai is not None:
        raise BadRequestError(
            f"{param}: only requests the gateway serves itself can be continued", param=param
        )
    if any(not 0 <= t < vocabulary for t in token_ids):
        raise BadRequestError(f"{param}: a token id is outside the vocabulary", param=param)
    if len(token_ids) >= prepared.generation.sampling.max_tokens:
        raise BadRequestError(
            f"{param}: {len(token_ids)} tokens already sent leave none of max_tokens "
            f"({prepared.generation.sampling.max_tokens})",
            param=param,
        )
    generation, routing = continuation(prepared.generation, token_ids, scheme)
    return replace(prepared, generation=generation, routing=routing)


def adopt_stream_id(prepared: Prepared, request_id: str) -> Prepared:
    """``prepared`` answering under the forwarding gateway's ``request_id`` (from
    :data:`REQUEST_ID_HEADER`, on a verified forwarded request only): the client, the
    logs and a continuation see that id, while the engine, the router's reservations
    and the engine's OpenAI layer keep this gateway's own (two forwards with one id
    cannot collide in an engine). Raises :class:`~firstlight.errors.BadRequestError`
    for an id that is not 1 to 128 of ``[A-Za-z0-9_.:-]``."""
    if not _REQUEST_ID.fullmatch(request_id):
        raise BadRequestError(f"{REQUEST_ID_HEADER}: not a request id: {request_id[:40]!r}")
    return replace(prepared, generation=replace(prepared.generation, stream_id=request_id))


def resume_body(body: bytes, token_ids: tuple[int, ...]) -> bytes:
    """The client's request ``body`` as a forwarded continuation: streamed, with usage,
    and the output tokens already sent (called by the forwarding gateway)."""
    data = json.loads(body)
    data["stream"] = True
    data["stream_options"] = {"include_usage": True}
    data[RESUME_FIELD] = {"token_ids": list(token_ids)}
    return json.dumps(data).encode()


async def peer_chunks(
    upstream: httpx.Response, kind: Kind, peer: Peer | None = None
) -> AsyncIterator[GenerationChunk]:
    """The peer's forwarded stream as output chunks; the final chunk carries the usage
    the peer sent after it. Raises :class:`PeerStreamError` for an error event, a
    malformed event, a broken connection (``peer`` failing a probe mid-answer included:
    :func:`~firstlight.regions.peers.while_answering`) or a stream that ends before
    ``[DONE]``; it is not ``resumable`` once a chunk came without its token ids. Closes
    ``upstream``."""
    lines = upstream.aiter_lines()
    events = sse_events(lines if peer is None else while_answering(lines, peer))
    held: GenerationChunk | None = None  # the finishing chunk, until the usage arrives
    exact = True  # every chunk so far carried its token ids
    try:
        while True:
            try:
                event = await anext(events)
                if event is None:  # [DONE]
                    if held is not None:
                        yield held
                    return
                chunk, with_ids = _chunk(event, kind)
            except StopAsyncIteration:
                error = PeerStreamError("the peer's stream ended before [DONE]")
            except ValueError as exc:
                error = PeerStreamError(f"the peer sent a malformed event: {exc}")
            except httpx.HTTPError as exc:
                error = PeerStreamError(f"the peer's stream broke off: {type(exc).__name__}")
            except PeerStreamError as exc:
                error = exc
            else:
                exact = exact and with_ids
                if chunk.usage is not None and held is not None:
                    held = replace(held, usage=chunk.usage)
                elif chunk.finish_reason is not None:
                    held = chunk
                elif chunk.text or chunk.token_ids:
                    yield chunk
                continue
            error.resumable = exact
            raise error
    finally:
        await upstream.aclose()


def _chunk(event: dict[str, Any], kind: Kind) -> tuple[GenerationChunk, bool]:
    """One of the peer's events as a chunk (a usage-only event has no text), and whether
    it carried its token ids (a usage-only event needs none)."""
    if "error" in event:
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise PeerStreamError(f"the peer's stream ended in an error: {message}")
    try:
        usage = _usage(event.get("usage"))
        choices = event.get("choices") or []
        if not choices:
            return GenerationChunk(str(event.get("id", "")), (), "", None, usage), True
        choice = choices[0]
        text = choice["delta"].get("content") if kind == "chat" else choice.get("text")
        ids = event.get(TOKENS_FIELD)
        with_ids = isinstance(ids, list) and all(type(t) is int for t in ids)
        reason = choice.get("finish_reason")
        finish = _FINISH_REASONS.get(reason) if isinstance(reason, str) else None
        token_ids = tuple(ids) if with_ids and isinstance(ids, list) else ()
        chunk = GenerationChunk(str(event.get("id", "")), token_ids, str(text or ""), finish, usage)
        return chunk, with_ids
    except (TypeError, KeyError, AttributeError) as exc:
        raise PeerStreamError(f"the peer sent a malformed chunk: {exc!r}") from exc


def _usage(value: object) -> Usage | None:
    if not isinstance(value, dict):
        return None
    details = value.get("prompt_tokens_details") or {}
    return Usage(
        int(value["prompt_tokens"]),
        int(value["completion_tokens"]),
        int(details.get("cached_tokens") or 0),
    )
