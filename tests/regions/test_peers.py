"""The peer table: circuit breaker states, and probes against a real loopback HTTP server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from firstlight.regions.hop import HopSigner
from firstlight.regions.peers import (
    CircuitBreaker,
    Peer,
    PeerGoneError,
    PeerTable,
    stop,
    while_answering,
)
from firstlight.regions.summary import ModelSummary, RegionSummary
from tests.conftest import FakeClock
from tests.regions.peer_server import PeerServer

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
    signer = HopSigner("probe-test-peer-key", "us-east")
    table = PeerTable([peer], client, signer=signer, rtt_alpha=0.3, clock=clock)

    await table.probe(peer)

    assert server.requests[0][0] == f"GET {SUMMARY_PATH}"
    # The probe is a signed hop (the peer verifies it with the shared key), no client key.
    probe_headers = server.requests[0][1]
    assert "authorization" not in probe_headers
    hop = HopSigner("probe-test-peer-key", "eu-west").verify(SUMMARY_PATH, probe_headers)
    assert hop is not None
    assert hop.region == "us-east"
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


async def test_a_failed_probe_hides_a_fresh_peer_until_a_probe_succeeds(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.serve_summary(_summary())
    peer = _peer(server.url, clock, failures=3, cooldown_s=5.0)
    table = PeerTable([peer], client, summary_max_age_s=60.0, clock=clock)
    await table.probe(peer)
    rtt_after_success = peer.rtt_ms

    server.status, server.body = 500, b"{}"
    await table.probe(peer)
    assert peer.breaker.state == "closed", "one failure: the breaker is still closed"
    assert table.usable("SmolLM2") == [], "but a failed probe hides the peer at once"
    assert not table.is_up(peer)
    for _ in range(2):
        await table.probe(peer)
    assert peer.breaker.state == "open"
    assert table.usable("SmolLM2") == [], "open, although its summary is fresh"
    assert peer.summary == _summary(), "the last good summary is kept"
    assert peer.rtt_ms == rtt_after_success
    assert peer.last_error is not None
    assert "500" in peer.last_error

    clock.advance(5.0)
    assert peer.breaker.state == "half-open"
    assert table.usable("SmolLM2") == [], "half-open: a probe tries it, not a request"

    server.serve_summary(_summary())
    await table.probe(peer)
    assert peer.breaker.state == "closed"
    assert peer.last_error is None
    assert table.usable("SmolLM2") == [peer]
    assert table.is_up(peer)


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


async def test_a_peer_that_never_answers_does_not_delay_the_others_probes(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.serve_summary(_summary())
    probed_three_times = asyncio.Event()
    server.on_request = lambda: len(server.requests) >= 3 and probed_three_times.set()
    hole = PeerServer()
    await hole.start()
    hole.hang = True
    good = _peer(server.url, clock)
    dark = Peer("ap-south", hole.url, 200.0, 0.0, CircuitBreaker(3, 5.0, clock))
    table = PeerTable([good, dark], client, probe_interval_s=0.01, probe_timeout_s=60.0)
    task = asyncio.create_task(table.run())
    try:
        async with asyncio.timeout(30):
            await probed_three_times.wait()
        assert len(hole.requests) == 1, "the dark peer's first probe is still waiting"
        assert table.usable("SmolLM2") == [good]
    finally:
        await stop(task)
        await hole.close()


async def test_a_failed_probe_releases_the_forwards_waiting_on_the_peer(
    server: PeerServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.serve_summary(_summary())
    peer = _peer(server.url, clock)
    table = PeerTable([peer], client, probe_timeout_s=0.2, clock=clock)
    await table.probe(peer)
    waiting = peer.failed()
    table.record_failure(peer, "HTTP 503")
    assert not waiting.is_set(), "a forward's failure: the peer answered, it is alive"
    server.hang = True
    await table.probe(peer)
    assert waiting.is_set()
    assert not peer.failed().is_set(), "the next failure gets a new event"


async def test_an_answer_that_started_is_abandoned_when_the_peer_fails_a_probe() -> None:
    """A peer that answered and then went silent: the read waiting for its next line
    ends with PeerGoneError (a transport error, so readers treat it as a broken
    connection) when the peer fails a probe, not after router.peer_timeout_s."""
    peer = _peer("http://127.0.0.1:9", FakeClock())
    abandoned = asyncio.Event()

    async def answer() -> AsyncIterator[str]:
        yield "data: first"
        try:
            await asyncio.Event().wait()  # silent from here on
        finally:
            abandoned.set()

    reading = while_answering(answer(), peer)
    assert await anext(reading) == "data: first"
    peer.failed()  # the event the reader waits on (it may not have asked yet)
    waiting = asyncio.ensure_future(anext(reading))
    peer.release_waiters()  # what a failed probe does
    with pytest.raises(PeerGoneError, match="eu-west stopped answering its probes"):
        async with asyncio.timeout(10):
            await waiting
    assert abandoned.is_set(), "the read in progress was cancelled"
    assert isinstance(PeerGoneError("x"), httpx.TransportError)


async def test_an_answering_peer_is_read_to_the_end() -> None:
    peer = _peer("http://127.0.0.1:9", FakeClock())

    async def answer() -> AsyncIterator[bytes]:
        for piece in (b"a", b"b", b"c"):
            yield piece

    assert [p async for p in while_answering(answer(), peer)] == [b"a", b"b", b"c"]
    assert not peer.failed().is_set()


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
