"""The peer table: circuit breaker states, and probes against a real loopback HTTP server."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from firstlight.regions.peers import CircuitBreaker, Peer, PeerTable, stop
from firstlight.regions.summary import ModelSummary, RegionSummary
from tests.conftest import FakeClock

SUMMARY_PATH = "/v1/firstlight/summary"


# --- circuit breaker -------------------------------------------------------------------


def test_breaker_starts_closed_and_allows() -> None:
    breaker = CircuitBreaker(failures=3, cooldown_s=10.0, clock=FakeClock())
    assert breaker.state == "closed"
    assert breaker.allow()
    assert breaker.allow()


def test_breaker_opens_after_consecutive_failures() -> None:
    breaker = CircuitBreaker(failures=3, cooldown_s=10.0, clock=FakeClock())
    breaker.failure()
    breaker.failure()
    assert breaker.state == "closed"
    assert breaker.allow()
    breaker.failure()
    assert breaker.state == "open"
    assert not breaker.allow()


def test_a_success_resets_the_consecutive_count() -> None:
    breaker = CircuitBreaker(failures=3, cooldown_s=10.0, clock=FakeClock())
    for _ in range(2):
        breaker.failure()
    breaker.success()
    for _ in range(2):
        breaker.failure()
    assert breaker.state == "closed"
    breaker.failure()
    assert breaker.state == "open"


def test_breaker_half_opens_after_the_cooldown_and_lets_one_trial_through() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=1, cooldown_s=10.0, clock=clock)
    breaker.failure()
    clock.advance(9.999)
    assert breaker.state == "open"
    assert not breaker.allow()
    clock.advance(0.001)
    assert breaker.state == "half-open"
    assert breaker.allow(), "the trial request"
    assert not breaker.allow(), "only one trial while it is in flight"
    assert breaker.state == "half-open"


def test_a_successful_trial_closes_the_breaker() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=2, cooldown_s=5.0, clock=clock)
    breaker.failure()
    breaker.failure()
    clock.advance(5.0)
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed"
    assert breaker.allow()
    assert breaker.allow()
    breaker.failure()
    assert breaker.state == "closed", "the count restarted from zero"


def test_a_failed_trial_reopens_for_a_full_cooldown() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=3, cooldown_s=5.0, clock=clock)
    for _ in range(3):
        breaker.failure()
    clock.advance(5.0)
    assert breaker.allow()
    breaker.failure()  # one failure is enough once open
    assert breaker.state == "open"
    assert not breaker.allow()
    clock.advance(4.9)
    assert breaker.state == "open"
    clock.advance(0.1)
    assert breaker.state == "half-open"
    assert breaker.allow(), "a new trial after the new cooldown"


# --- a real HTTP peer ------------------------------------------------------------------


class PeerServer:
    """A tiny HTTP/1.1 server on a free loopback port that answers every request with
    the current ``status`` and ``body``; ``hang`` makes it never answer."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b"{}"
        self.hang = False
        self.on_request: Callable[[], None] | None = None
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.url = ""

    def serve_summary(self, summary: RegionSummary) -> None:
        self.status = 200
        self.body = json.dumps(summary.to_json()).encode()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        self._release.set()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = (await reader.readline()).decode()
            headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            method, path, _ = request_line.split(" ", 2)
            self.requests.append((f"{method} {path}", headers))
            if self.on_request is not None:
                self.on_request()
            if self.hang:
                await self._release.wait()
                return
            head = (
                f"HTTP/1.1 {self.status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + self.body)
            await writer.drain()
        finally:
            writer.close()
            await writer.wait_closed()


@pytest.fixture
async def server() -> AsyncIterator[PeerServer]:
    peer_server = PeerServer()
    await peer_server.start()
    yield peer_server
    await peer_server.close()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as http:
        yield http


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _summary(healthy: int = 2) -> RegionSummary:
    return RegionSummary(
        "eu-west",
        1_700_000_000.0,
        {
            "SmolLM2": ModelSummary(healthy, 12.0, 0.3, frozenset({1, 2})),
            "down-model": ModelSummary(0, 0.0, 0.3),
        },
    )


def _peer(
    url: str,
    clock: FakeClock,
    *,
    rtt_ms: float = 80.0,
    emulated_ms: float = 0.0,
    failures: int = 3,
    cooldown_s: float = 5.0,
) -> Peer:
    return Peer("eu-west", url, rtt_ms, emulated_ms, CircuitBreaker(failures, cooldown_s, clock))


async def test_a_healthy_probe_stores_the_summary_and_smooths_the_rtt(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock(1_000.0)
    server.serve_summary(_summary())
    server.on_request = lambda: clock.advance(0.05)  # the round trip takes 50 ms
    peer = _peer(server.url, clock, rtt_ms=80.0, emulated_ms=20.0)
    table = PeerTable(
        [peer], client, headers={"authorization": "Bearer peer-key"}, rtt_alpha=0.3, clock=clock
    )

    await table.probe(peer)

    assert server.requests[0][0] == f"GET {SUMMARY_PATH}"
    assert server.requests[0][1]["authorization"] == "Bearer peer-key"
    # sample = 50 ms measured + 20 ms emulated; EWMA with the configured 80 ms as prior
    assert peer.rtt_ms == pytest.approx(0.7 * 80.0 + 0.3 * 70.0)
    assert peer.summary == _summary()
    assert peer.summary_received_at == pytest.approx(1_000.05)
    assert peer.last_error is None
    assert peer.breaker.state == "closed"

    await table.probe(peer)
    assert peer.rtt_ms == pytest.approx(0.7 * (0.7 * 80.0 + 0.3 * 70.0) + 0.3 * 70.0)


async def test_usable_needs_a_healthy_model_and_a_fresh_summary(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.serve_summary(_summary())
    peer = _peer(server.url, clock)
    table = PeerTable([peer], client, summary_max_age_s=10.0, clock=clock)
    assert table.usable("SmolLM2") == [], "no summary yet"

    await table.probe(peer)
    assert table.usable("SmolLM2") == [peer]
    assert table.usable("down-model") == [], "no healthy replica"
    assert table.usable("not-served-there") == []

    clock.advance(10.0)
    assert table.usable("SmolLM2") == [peer], "exactly max age is still fresh"
    clock.advance(0.01)
    assert table.usable("SmolLM2") == [], "stale summary"

    await table.probe(peer)
    assert table.usable("SmolLM2") == [peer], "a new probe refreshes it"


async def test_a_summary_showing_no_healthy_replica_makes_the_peer_unusable(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.serve_summary(_summary(healthy=1))
    peer = _peer(server.url, clock)
    table = PeerTable([peer], client, clock=clock)
    await table.probe(peer)
    assert table.usable("SmolLM2") == [peer]
    server.serve_summary(_summary(healthy=0))
    await table.probe(peer)
    assert table.usable("SmolLM2") == []


# (id, status, body, the exception named in last_error; None: whichever parse error)
BAD_ANSWERS = [
    ("http-500", 500, b'{"error": "boom"}', "HTTPStatusError"),
    ("http-404", 404, b"", "HTTPStatusError"),
    ("not-json", 200, b"<html>oops</html>", "JSONDecodeError"),
    ("json-null", 200, b"null", "ValueError"),
    (
        "missing-field",
        200,
        b'{"region": "eu-west", "at": 1, "models": {"SmolLM2": {"healthy_replicas": 1}}}',
        None,
    ),
    (
        "model-not-object",
        200,
        b'{"region": "eu-west", "at": 1, "models": {"SmolLM2": [1]}}',
        None,
    ),
]


@pytest.mark.parametrize(
    ("status", "body", "error_type"),
    [case[1:] for case in BAD_ANSWERS],
    ids=[case[0] for case in BAD_ANSWERS],
)
async def test_a_bad_answer_is_a_failure(
    server: PeerServer,
    client: httpx.AsyncClient,
    status: int,
    body: bytes,
    error_type: str | None,
) -> None:
    clock = FakeClock()
    server.status, server.body = status, body
    peer = _peer(server.url, clock, rtt_ms=80.0, failures=1)
    table = PeerTable([peer], client, clock=clock)

    await table.probe(peer)

    assert peer.last_error
    if error_type is not None:
        assert peer.last_error.startswith(f"{error_type}: ")
    assert peer.breaker.state == "open"
    assert peer.summary is None
    assert peer.rtt_ms == 80.0, "a failed probe is not an RTT sample"
    assert table.usable("SmolLM2") == []


async def test_a_refused_connection_is_a_failure(client: httpx.AsyncClient) -> None:
    clock = FakeClock()
    peer = _peer(f"http://127.0.0.1:{_closed_port()}", clock, failures=2)
    table = PeerTable([peer], client, clock=clock)
    await table.probe(peer)
    assert peer.last_error is not None
    assert peer.last_error.startswith("ConnectError: ")
    assert peer.breaker.state == "closed"
    await table.probe(peer)
    assert peer.breaker.state == "open"


async def test_a_peer_that_never_answers_times_out(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.hang = True
    peer = _peer(server.url, clock, failures=1)
    table = PeerTable([peer], client, probe_timeout_s=0.2, clock=clock)
    await table.probe(peer)
    assert peer.last_error is not None
    assert peer.last_error.startswith("ReadTimeout")
    assert peer.breaker.state == "open"


async def test_an_open_breaker_hides_a_fresh_peer_until_it_half_opens(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.serve_summary(_summary())
    peer = _peer(server.url, clock, failures=3, cooldown_s=5.0)
    table = PeerTable([peer], client, summary_max_age_s=60.0, clock=clock)
    await table.probe(peer)
    rtt_after_success = peer.rtt_ms

    server.status, server.body = 500, b"{}"
    for _ in range(2):
        await table.probe(peer)
    assert table.usable("SmolLM2") == [peer], "two failures: still closed"
    await table.probe(peer)
    assert peer.breaker.state == "open"
    assert table.usable("SmolLM2") == [], "open, although its summary is fresh"
    assert peer.summary == _summary(), "the last good summary is kept"
    assert peer.rtt_ms == rtt_after_success
    assert peer.last_error is not None
    assert "500" in peer.last_error

    clock.advance(5.0)
    assert peer.breaker.state == "half-open"
    assert table.usable("SmolLM2") == [peer], "half-open peers are offered for a trial"

    server.serve_summary(_summary())
    await table.probe(peer)
    assert peer.breaker.state == "closed"
    assert peer.last_error is None


async def test_forward_outcomes_drive_the_breaker(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.serve_summary(_summary())
    peer = _peer(server.url, clock, failures=2)
    table = PeerTable([peer], client, clock=clock)
    await table.probe(peer)

    table.record_failure(peer, "HTTP 502")
    assert peer.last_error == "HTTP 502"
    table.record_success(peer)
    table.record_failure(peer, "ReadError: reset")
    assert peer.breaker.state == "closed", "the success in between reset the count"
    table.record_failure(peer, "ReadError: reset")
    assert peer.breaker.state == "open"
    assert peer.last_error == "ReadError: reset"
    assert table.usable("SmolLM2") == []
    table.record_success(peer)
    assert table.usable("SmolLM2") == [peer]


async def test_run_probes_every_peer_and_survives_their_faults(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.serve_summary(_summary())
    good = _peer(server.url, clock)
    bad = Peer(
        "ap-south", f"http://127.0.0.1:{_closed_port()}", 200.0, 0.0, CircuitBreaker(1, 5.0, clock)
    )
    table = PeerTable([good, bad], client, probe_interval_s=3600.0, clock=clock)
    assert set(table.peers) == {"eu-west", "ap-south"}

    task = asyncio.create_task(table.run())
    await table.wait_probed()

    assert good.summary == _summary()
    assert bad.last_error is not None
    assert bad.breaker.state == "open"
    assert table.usable("SmolLM2") == [good]
    assert not task.done(), "a peer's fault does not end the probe loop"
    await stop(task)
    assert task.cancelled()


NON_FINITE_ANSWERS = [
    (
        "infinite-replica-count",
        b'{"region": "eu-west", "at": 1, "models": {"SmolLM2": {"healthy_replicas": Infinity, "predicted_wait_ms": 1, "prefill_ms_per_token": 1}}}',
    ),
    (
        "infinite-hot-block",
        b'{"region": "eu-west", "at": 1, "models": {"SmolLM2": {"healthy_replicas": 1, "predicted_wait_ms": 1, "prefill_ms_per_token": 1, "hot_blocks": [-Infinity]}}}',
    ),
    ("deeply-nested", b"[" * 100_000 + b"]" * 100_000),
]


@pytest.mark.parametrize(
    "body", [case[1] for case in NON_FINITE_ANSWERS], ids=[case[0] for case in NON_FINITE_ANSWERS]
)
async def test_any_malformed_summary_is_a_failure_not_an_exception(
    server: PeerServer, client: httpx.AsyncClient, body: bytes
) -> None:
    clock = FakeClock()
    server.status, server.body = 200, body
    peer = _peer(server.url, clock, failures=1)
    table = PeerTable([peer], client, clock=clock)

    await table.probe(peer)  # a peer's fault must not escape the probe

    assert peer.last_error is not None
    assert peer.breaker.state == "open"
    assert peer.summary is None


async def test_a_malformed_peer_does_not_stop_the_probe_loop(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.serve_summary(_summary())
    malformed = PeerServer()
    await malformed.start()
    malformed.body = NON_FINITE_ANSWERS[0][1]
    good = _peer(server.url, clock)
    bad = Peer("ap-south", malformed.url, 200.0, 0.0, CircuitBreaker(1, 5.0, clock))
    table = PeerTable([good, bad], client, probe_interval_s=3600.0, clock=clock)

    task = asyncio.create_task(table.run())
    probed = asyncio.create_task(table.wait_probed())
    try:
        await asyncio.wait({task, probed}, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), f"the probe loop ended: {task.exception()!r}"
        assert good.summary == _summary()
        assert bad.breaker.state == "open"
    finally:
        probed.cancel()
        if task.done():
            task.exception()  # retrieved, so asyncio does not log it again
        else:
            await stop(task)
        await malformed.close()
