"""The replica port's wire format: frames, the challenge's answer, and the codec of what
goes through them, with the errors both sides raise.

Both ends of :mod:`firstlight.serve.replica_port` use it: :class:`ReplicaPortServer
<firstlight.serve.replica_port.ReplicaPortServer>` in the replica reads request frames
(:func:`decode_request`) and writes item, error and ``busy`` frames;
:class:`ReplicaPortClient <firstlight.serve.replica_port.ReplicaPortClient>` in the
gateway writes request frames (:func:`encode_request`), answers the challenge
(:func:`proof`) and turns item frames back into what the handle path yields or raises
(:func:`decode_item`). The format itself (length-prefixed UTF-8 JSON, an empty frame
ending a stream) is described in that module's docstring; the public names are
re-exported from it. Pure: no sockets, only the frame reader awaits a stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import struct
from typing import Any

from firstlight.engine.protocol import GenerationChunk, GenerationRequest, SamplingSettings, Usage
from firstlight.errors import EngineDeadError, InvalidRequestError
from firstlight.prefix import LoraKey
from firstlight.region.state import ServedBy
from firstlight.routing import RequestView

__all__ = [
    "AUTH_FRAME_BYTES",
    "MAX_FRAME_BYTES",
    "ReplicaPortAuthError",
    "ReplicaPortError",
    "decode_item",
    "decode_request",
    "encode_busy",
    "encode_error",
    "encode_item",
    "encode_request",
    "frame",
    "proof",
    "read_frame",
]

_HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 64 * 1024 * 1024
"""A frame above this is refused (a request frame of the longest prompts is a few MiB)."""
AUTH_FRAME_BYTES = 128
"""The challenge and its answer are small; a larger frame before authentication ends
the connection (no one unauthenticated makes the replica buffer a large frame)."""
_AUTH_CONTEXT = b"firstlight-replica-port-v1\n"


class ReplicaPortError(ConnectionError):
    """The replica's port could not be reached, broke the stream, or refused it
    (``busy``: draining or at its bound). Before the first chunk the gateway tries
    another replica; after it, the stream is resumed (:mod:`firstlight.api.migration`)."""


class ReplicaPortAuthError(ReplicaPortError):
    """The replica refused the gateway's answer to its challenge: the two hold different
    port keys (a replica of another build, during a rolling update)."""


# --- frames and the codec ----------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> bytes:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > limit:
        raise ReplicaPortError(f"a frame of {size} bytes exceeds {limit}")
    return await reader.readexactly(size) if size else b""


def proof(key: bytes, nonce: bytes) -> bytes:
    """The answer to the replica's challenge ``nonce``."""
    return hmac.new(key, _AUTH_CONTEXT + nonce, hashlib.sha256).hexdigest().encode()


def encode_request(
    request: GenerationRequest, routing: RequestView, trace_context: dict[str, str]
) -> bytes:
    """The request frame's payload (the gateway's side)."""
    s = request.sampling
    data = {
        "id": request.request_id,
        "prompt": request.prompt_token_ids,
        "sampling": [s.max_tokens, s.temperature, s.top_p, s.seed, s.stop, s.defaulted],
        "salt": request.cache_salt,
        "lora": None if request.lora is None else [request.lora.name, request.lora.path],
        "resumed": request.resumed_tokens,
        "stream": request.stream_id,
        "routing": [routing.prompt_tokens, routing.block_hashes, routing.block_size],
        "trace": trace_context,
    }
    return json.dumps(data, separators=(",", ":")).encode()


def decode_request(payload: bytes) -> tuple[GenerationRequest, RequestView, dict[str, str]]:
    """The request, its routing view and trace context from a request frame (the
    replica's side). Raises ``InvalidRequestError`` for a malformed frame."""
    try:
        data = json.loads(payload)
        max_tokens, temperature, top_p, seed, stop, defaulted = data["sampling"]
        sampling = SamplingSettings(
            int(max_tokens),
            float(temperature),
            float(top_p),
            None if seed is None else int(seed),
            tuple(str(x) for x in stop),
            tuple(str(x) for x in defaulted),
        )
        lora = None if data["lora"] is None else LoraKey(*map(str, data["lora"]))
        request = GenerationRequest(
            str(data["id"]),
            tuple(int(t) for t in data["prompt"]),
            sampling,
            None if data["salt"] is None else str(data["salt"]),
            lora,
            int(data["resumed"]),
            str(data.get("stream", "")),  # a gateway of an older release sends none
        )
        prompt_tokens, hashes, block_size = data["routing"]
        routing = RequestView(
            request.request_id, int(prompt_tokens), tuple(int(h) for h in hashes), int(block_size)
        )
        trace = {str(k): str(v) for k, v in dict(data["trace"]).items()}
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidRequestError(f"malformed replica-port request: {exc}") from exc
    return request, routing, trace


def encode_item(item: ServedBy | GenerationChunk) -> bytes:
    if isinstance(item, ServedBy):
        data: dict[str, Any] = {"served_by": item.replica_id}
    else:
        usage = item.usage
        data = {
            "tokens": item.token_ids,
            "text": item.text,
            "finish": item.finish_reason,
            "usage": None
            if usage is None
            else [usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens],
        }
    return json.dumps(data, separators=(",", ":")).encode()


def encode_error(exc: BaseException) -> bytes:
    if isinstance(exc, InvalidRequestError):
        data = {"error": "invalid", "message": str(exc), "param": exc.param}
    elif isinstance(exc, EngineDeadError):
        data = {"error": "dead", "message": str(exc)}
    else:
        data = {"error": "failed", "message": f"{type(exc).__name__}: {exc}"}
    return json.dumps(data).encode()


def encode_busy(reason: str) -> bytes:
    return json.dumps({"error": "busy", "message": reason}).encode()


def decode_item(payload: bytes, request_id: str) -> ServedBy | GenerationChunk:
    data = json.loads(payload)
    if "served_by" in data:
        return ServedBy(str(data["served_by"]))
    error = data.get("error")
    if error == "invalid":
        raise InvalidRequestError(str(data["message"]), param=data.get("param"))
    if error == "dead":
        raise EngineDeadError(str(data["message"]))
    if error == "unauthorized":
        raise ReplicaPortAuthError(f"the replica's port: {data['message']}")
    if error is not None:
        raise ReplicaPortError(f"the replica's port: {error}: {data['message']}")
    usage = data["usage"]
    return GenerationChunk(
        request_id,
        tuple(data["tokens"]),
        data["text"],
        data["finish"],
        None if usage is None else Usage(*usage),
    )
