"""A model replica's own port: the tokens of a locally served request in one hop.

Why: Ray's handle path costs about 4.5 ms per request on top of the transport, and
limits one ingress to a fraction of the requests per second a plain TCP stream carries
(``firstlight bench data-path``, docs/architecture.md). With ``gateway.data_path:
replica-port`` the gateway chooses the replica itself (its ticket's decision) and
streams from that replica's port; the model stays a Ray Serve deployment for placement,
health checks, replacement and draining, and publishes its address in its routing stats
(``ReplicaStats.data_address``).

* :class:`ReplicaPortServer` runs in the ModelServer replica
  (:mod:`firstlight.serve.model_server`): started on the replica's loop, it serves one
  stream at a time per connection, refuses new streams while the replica drains or is
  at its bound (``busy`` frames: the gateway tries another replica), aborts a stream
  whose connection closed (the client went away), and counts what it served.
* :class:`ReplicaPortClient` runs in the gateway (:mod:`firstlight.serve.gateway_deployment`):
  a pool of keep-alive connections per address; :meth:`ReplicaPortClient.stream` yields
  what the replica's ``generate`` yields (a ``ServedBy``, then ``GenerationChunk``s) and
  raises what the handle path raises (``InvalidRequestError``, ``EngineDeadError``) or
  :class:`ReplicaPortError` when the connection fails or the replica refuses.

Wire format: length-prefixed frames (4 bytes, big-endian, then UTF-8 JSON); a request
frame, then item frames, then an empty frame that ends the stream. TCP's flow control
is the backpressure: the replica awaits ``drain()`` after every frame. The frames, the
codec of what they carry and the errors both sides raise are in
:mod:`firstlight.serve._port_codec`; its public names are importable from here.

Who may stream: every connection starts with a challenge. The replica sends a random
nonce; the gateway answers with HMAC-SHA256 over it, keyed with the port key the app
builder hands both deployments (:func:`firstlight.serve.app.region_app`). A connection
that answers wrong gets an ``unauthorized`` frame and is closed before any request is
read, so a neighbour pod that reaches the port can neither generate nor abort anything.
The gateway treats ``unauthorized`` as a replica of another build (a rolling update
with a new key): it takes the handle path for that request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from firstlight.engine.protocol import GenerationChunk, GenerationRequest
from firstlight.errors import InvalidRequestError
from firstlight.region.state import ServedBy
from firstlight.routing import RequestView
from firstlight.serve._port_codec import (
    AUTH_FRAME_BYTES,
    MAX_FRAME_BYTES,
    ReplicaPortAuthError,
    ReplicaPortError,
    decode_item,
    decode_request,
    encode_busy,
    encode_error,
    encode_item,
    encode_request,
    frame,
    proof,
    read_frame,
)

__all__ = [
    "MAX_FRAME_BYTES",
    "ReplicaPortAuthError",
    "ReplicaPortClient",
    "ReplicaPortError",
    "ReplicaPortServer",
    "decode_request",
    "encode_request",
]

_log = logging.getLogger(__name__)

_IDLE_PER_ADDRESS = 64
"""Idle connections the gateway keeps per replica (more are closed after use)."""

Generate = Callable[[GenerationRequest, RequestView, dict[str, str]], AsyncIterator[Any]]
"""The replica's stream of one request (``ModelServer.generate``)."""


# --- the replica's side ------------------------------------------------------------------


@dataclass(slots=True)
class PortCounters:
    """What the port served since the replica started (its routing stats carry them)."""

    connections: int = 0
    """Connections accepted (gateways keep theirs open across streams)."""
    streams: int = 0
    refused: int = 0
    unauthorized: int = 0
    """Connections closed because their answer to the challenge was wrong."""
    aborted: int = 0
    """Streams whose connection closed before their end (the client went away)."""


class ReplicaPortServer:
    """The replica's port (see the module docstring). ``generate`` streams one request;
    ``accepting`` says whether new streams are taken; ``busy`` says, with the bound
    ``max_streams``, whether the replica is full; ``key`` is the port key its callers
    must prove they hold."""

    def __init__(
        self,
        generate: Generate,
        accepting: Callable[[], bool],
        inflight: Callable[[], int],
        max_streams: int,
        key: bytes,
    ) -> None:
        self._key = key
        self._generate = generate
        self._accepting = accepting
        self._inflight = inflight
        self._max_streams = max_streams
        self._server: asyncio.Server | None = None
        self.counters = PortCounters()
        self.address: str | None = None

    async def start(self, host: str) -> str:
        """Listen on a free port of ``host``; returns ``host:port``. Called once by the
        replica on its own event loop."""
        self._server = await asyncio.start_server(self._connection, host, 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"{host}:{port}"
        return self.address

    async def close(self) -> None:
        """Stop taking connections; streams in flight go on (the replica's drain waits
        for them, then the engine stops)."""
        if self._server is not None:
            self._server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counters.connections += 1
        try:
            if not await self._authenticated(reader, writer):
                return
            while True:
                try:
                    payload = await read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the gateway closed an idle connection
                if not await self._one(payload, reader, writer):
                    return
        finally:
            writer.close()

    async def _authenticated(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Challenge the caller; ``False`` (after telling it, when it answered) unless it
        proves it holds the port key."""
        nonce = secrets.token_hex(16).encode()
        try:
            writer.write(frame(nonce))
            await writer.drain()
            answer = await read_frame(reader, AUTH_FRAME_BYTES)
        except (asyncio.IncompleteReadError, ConnectionError):
            return False  # gone, or a frame too large to be an answer
        if hmac.compare_digest(answer, proof(self._key, nonce)):
            return True
        self.counters.unauthorized += 1
        refusal = {"error": "unauthorized", "message": "wrong answer to the port's challenge"}
        with contextlib.suppress(ConnectionError):
            writer.write(frame(json.dumps(refusal).encode()))
            await writer.drain()
        return False

    async def _one(
        self, payload: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one request frame; ``False`` when the connection is done with."""
        if not self._accepting() or self._inflight() >= self._max_streams:
            self.counters.refused += 1
            reason = "draining" if not self._accepting() else "at max_ongoing_requests"
            writer.write(frame(encode_busy(reason)))
            await writer.drain()
            return True
        try:
            request, routing, trace = decode_request(payload)
        except InvalidRequestError as exc:
            writer.write(frame(encode_error(exc)))
            await writer.drain()
            return False  # a frame this port cannot read: the peer is not a gateway
        self.counters.streams += 1
        stream = self._generate(request, routing, trace)
        # The connection is idle while the stream runs: its end means the gateway closed
        # it (its client went away), and this task is cancelled, which stops the
        # engine's work on the request. The watch is cancelled before the end frame goes
        # out, so that it never reads a byte of the gateway's next request.
        task = asyncio.current_task()
        assert task is not None

        def stop(_: asyncio.Future[bytes]) -> None:
            task.cancel()

        closed = asyncio.ensure_future(reader.read(1))
        closed.add_done_callback(stop)
        failure: Exception | None = None
        try:
            async for item in stream:
                writer.write(frame(encode_item(item)))
                await writer.drain()
        except asyncio.CancelledError:
            if not closed.done() or task.uncancel() > 0:
                raise  # not the watch's doing: the server is stopping
            self.counters.aborted += 1
            return False
        except ConnectionError:
            self.counters.aborted += 1
            return False
        except Exception as exc:  # the engine failed: the gateway is told, the port stays
            failure = exc
        finally:
            closed.remove_done_callback(stop)
            spoke = closed.done()  # bytes or EOF during a stream: the peer is gone
            if not spoke:
                closed.cancel()
                # Until the cancelled read has unwound, the reader counts it as waiting
                # and refuses the next request's read (RuntimeError).
                await asyncio.wait((closed,))
            await _aclose(stream)
        if spoke:
            return False
        try:
            if failure is not None:
                writer.write(frame(encode_error(failure)))
            writer.write(frame(b""))
            await writer.drain()
        except ConnectionError:
            return False
        return True


async def _aclose(stream: AsyncIterator[Any]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


# --- the gateway's side ------------------------------------------------------------------


_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ReplicaPortClient:
    """Pooled connections to the replicas' ports (see the module docstring), each
    answering its replica's challenge with ``key``. One per gateway process, used on its
    event loop only."""

    def __init__(self, key: bytes, connect_timeout_s: float = 2.0) -> None:
        self._key = key
        self._idle: dict[str, list[_Connection]] = {}
        self._connect_timeout_s = connect_timeout_s

    async def stream(
        self,
        address: str,
        request: GenerationRequest,
        routing: RequestView,
        trace_context: dict[str, str],
    ) -> AsyncGenerator[ServedBy | GenerationChunk, None]:
        """What the replica at ``address`` streams for ``request``. Closing the iterator
        before its end closes the connection, which stops the replica's work."""
        reader, writer = await self._connection(address)
        clean = False
        try:
            writer.write(frame(encode_request(request, routing, trace_context)))
            await writer.drain()
            while True:
                payload = await read_frame(reader)
                if not payload:
                    clean = True
                    return
                item = decode_item(payload, request.request_id)
                yield item
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            if isinstance(exc, ReplicaPortError):
                raise
            raise ReplicaPortError(f"the replica at {address} broke the stream: {exc!r}") from exc
        finally:
            if clean:
                self._release(address, reader, writer)
            else:
                writer.close()

    async def _connection(self, address: str) -> _Connection:
        pool = self._idle.get(address)
        while pool:
            reader, writer = pool.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        host, port = address.rsplit(":", 1)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                reader, writer = await asyncio.open_connection(host, int(port))
                nonce = await read_frame(reader, AUTH_FRAME_BYTES)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            raise ReplicaPortError(f"cannot reach the replica at {address}: {exc!r}") from exc
        writer.write(frame(proof(self._key, nonce)))  # sent with the first request
        return reader, writer

    def _release(
        self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        pool = self._idle.setdefault(address, [])
        if len(pool) < _IDLE_PER_ADDRESS and not writer.is_closing():
            pool.append((reader, writer))
        else:
            writer.close()

    def forget(self, keep: set[str]) -> None:
        """Close idle connections to addresses not in ``keep`` (replicas that left)."""
        for address in [a for a in self._idle if a not in keep]:
            for _, writer in self._idle.pop(address):
                writer.close()

    async def aclose(self) -> None:
        """Close every idle connection (the gateway is stopping)."""
        self.forget(set())
