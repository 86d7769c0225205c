"""The replica's own port, without Ray: the codec, a stream end to end over real TCP,
errors mapped as the handle path maps them, refusals, pooling, and a closed connection
stopping the replica's work."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from firstlight.engine.protocol import GenerationChunk, GenerationRequest, SamplingSettings, Usage
from firstlight.errors import EngineDeadError, InvalidRequestError
from firstlight.prefix import LoraKey
from firstlight.region.state import ServedBy
from firstlight.routing import RequestView
from firstlight.serve.replica_port import (
    ReplicaPortAuthError,
    ReplicaPortClient,
    ReplicaPortError,
    ReplicaPortServer,
    decode_request,
    encode_request,
)


def _request(rid: str = "r1", max_tokens: int = 3) -> tuple[GenerationRequest, RequestView]:
    sampling = SamplingSettings(max_tokens, 0.7, 0.9, 5, ("\n",), ("top_p",))
    request = GenerationRequest(
        rid, (1, 2, 3), sampling, "salt", LoraKey("a", "/x"), 2, stream_id="chatcmpl-fwd"
    )
    return request, RequestView(rid, 3, (11, 2**63 - 1), 16)


def test_the_request_frame_round_trips() -> None:
    request, routing = _request()
    back = decode_request(encode_request(request, routing, {"traceparent": "00-ab"}))
    assert back == (request, routing, {"traceparent": "00-ab"})


def test_a_malformed_request_frame_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="malformed"):
        decode_request(b'{"id": "x"}')


class _Replica:
    """A replica's ``generate`` and state, as the port sees them."""

    def __init__(self, fail: BaseException | None = None, hold: bool = False) -> None:
        self.fail, self.hold = fail, hold
        self.accepting, self.inflight = True, 0
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.seen: list[str] = []

    async def generate(
        self, request: GenerationRequest, routing: RequestView, trace: dict[str, str]
    ) -> AsyncIterator[ServedBy | GenerationChunk]:
        self.inflight += 1
        self.seen.append(request.request_id)
        try:
            yield ServedBy("replica-a")
            self.started.set()
            if self.fail is not None:
                raise self.fail
            if self.hold:
                await asyncio.Event().wait()  # until the stream is cancelled
            n = request.sampling.max_tokens
            for i in range(n):
                await asyncio.sleep(0)  # an engine step: the replica's loop runs others
                usage = Usage(3, n, 1) if i == n - 1 else None
                yield GenerationChunk(
                    request.request_id, (100 + i,), f"t{i}", "length" if usage else None, usage
                )
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled.set()
            raise
        finally:
            self.inflight -= 1


PORT_KEY = b"k" * 32


async def _serve(replica: _Replica, bound: int = 8) -> tuple[ReplicaPortServer, str]:
    server = ReplicaPortServer(
        replica.generate, lambda: replica.accepting, lambda: replica.inflight, bound, PORT_KEY
    )
    return server, await server.start("127.0.0.1")


async def _collect(client: ReplicaPortClient, address: str, rid: str = "r1") -> list[object]:
    request, routing = _request(rid)
    return [item async for item in client.stream(address, request, routing, {})]


def test_one_connection_carries_back_to_back_streams_from_another_loop() -> None:
    """The replica's loop and the gateway's are different processes' in production: the
    gateway's next request can arrive before the replica has unwound its last stream's
    connection watch (a read it cancelled); the port must still read it."""
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        replica_box: list[_Replica] = []

        async def start() -> tuple[ReplicaPortServer, str]:
            replica_box.append(_Replica())
            return await _serve(replica_box[0])

        server, address = asyncio.run_coroutine_threadsafe(start(), loop).result(10)

        async def client_side() -> None:
            client = ReplicaPortClient(PORT_KEY)
            for i in range(50):
                assert len(await _collect(client, address, f"q{i}")) == 4
            await client.aclose()

        asyncio.run(client_side())
        assert server.counters.streams == 50
        assert server.counters.connections == 1  # never dropped between streams

        async def stop() -> None:
            await server.close()
            await server._server.wait_closed()  # type: ignore[union-attr]

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def test_a_stream_arrives_whole_and_its_connection_is_reused() -> None:
    replica = _Replica()
    server, address = await _serve(replica)
    client = ReplicaPortClient(PORT_KEY)
    first = await _collect(client, address, "r1")
    second = await _collect(client, address, "r2")
    for i in range(30):  # back to back on one connection: each read waits for the last
        assert len(await _collect(client, address, f"more-{i}")) == 4
    assert first[0] == ServedBy("replica-a")
    assert [c.token_ids for c in first[1:]] == [(100,), (101,), (102,)]  # type: ignore[attr-defined]
    assert first[-1] == GenerationChunk("r1", (102,), "t2", "length", Usage(3, 3, 1))
    assert second[-1].request_id == "r2"  # type: ignore[attr-defined]
    assert server.counters.streams == 32
    assert len(client._idle[address]) == 1  # one connection carried them all
    await client.aclose()
    await server.close()


@pytest.mark.parametrize(
    ("fail", "raised"),
    [
        (InvalidRequestError("too long", param="messages"), InvalidRequestError),
        (EngineDeadError("engine died"), EngineDeadError),
        (RuntimeError("boom"), ReplicaPortError),
    ],
)
async def test_a_failure_is_raised_at_the_gateway_as_the_handle_path_raises_it(
    fail: BaseException, raised: type[BaseException]
) -> None:
    server, address = await _serve(_Replica(fail=fail))
    client = ReplicaPortClient(PORT_KEY)
    with pytest.raises(raised) as caught:
        await _collect(client, address)
    assert str(fail) in str(caught.value)
    if isinstance(fail, InvalidRequestError):
        assert caught.value.param == "messages"  # type: ignore[attr-defined]
    await server.close()


async def test_a_draining_or_full_replica_refuses_and_serves_nothing() -> None:
    replica = _Replica()
    server, address = await _serve(replica, bound=1)
    replica.accepting = False
    with pytest.raises(ReplicaPortError, match="draining"):
        await _collect(ReplicaPortClient(PORT_KEY), address)
    replica.accepting, replica.inflight = True, 1  # at its bound of 1
    with pytest.raises(ReplicaPortError, match="max_ongoing_requests"):
        await _collect(ReplicaPortClient(PORT_KEY), address)
    assert (server.counters.streams, server.counters.refused) == (0, 2)
    await server.close()


async def test_an_unreachable_port_is_a_replica_port_error() -> None:
    server, address = await _serve(_Replica())
    await server.close()
    await server._server.wait_closed()  # type: ignore[union-attr]
    with pytest.raises(ReplicaPortError, match="cannot reach"):
        await _collect(ReplicaPortClient(PORT_KEY), address)


async def test_closing_the_stream_early_stops_the_replicas_work() -> None:
    replica = _Replica(hold=True)
    server, address = await _serve(replica)
    client = ReplicaPortClient(PORT_KEY)
    request, routing = _request()
    stream = client.stream(address, request, routing, {})
    assert await anext(stream) == ServedBy("replica-a")
    await replica.started.wait()
    await stream.aclose()  # the client went away
    await asyncio.wait_for(replica.cancelled.wait(), 5.0)
    assert server.counters.aborted == 1
    assert address not in client._idle or not client._idle[address]  # not pooled
    await server.close()


async def test_a_caller_without_the_port_key_can_neither_stream_nor_abort() -> None:
    """The hole: the port served anyone who reached it (a neighbour pod could generate
    on the replica, or close a connection to abort). Now a wrong key gets
    ``unauthorized`` before any request is read, and the engine never sees it."""
    replica = _Replica()
    server, address = await _serve(replica)
    try:
        with pytest.raises(ReplicaPortAuthError):
            await _collect(ReplicaPortClient(b"not-the-key" * 3), address, "intruder")
        assert replica.seen == []
        assert server.counters.unauthorized == 1
        assert server.counters.streams == 0
        # An answer too large to be one ends the connection without buffering it.
        reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
        await reader.readexactly(4 + 32)  # the challenge
        writer.write((64 * 1024 * 1024).to_bytes(4, "big"))
        await writer.drain()
        assert await reader.read() == b""  # closed
        writer.close()
        await writer.wait_closed()
        # The right key streams as before.
        client = ReplicaPortClient(PORT_KEY)
        assert len(await _collect(client, address)) == 4
        await client.aclose()
    finally:
        await server.close()
