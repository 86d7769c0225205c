"""The peer table of one gateway: RTT probes, peer summaries and a circuit breaker each.

A :class:`PeerTable` is built by the gateway from ``regions[].peers`` and runs
:meth:`PeerTable.run` as a background task: every ``probe_interval_s`` it fetches each
peer's summary (``GET {url}/v1/firstlight/summary``, a signed hop of
:mod:`firstlight.regions.hop`, at most ``probe_timeout_s``) and
takes the round trip of that request as an RTT sample (EWMA; the configured ``rtt_ms``
is the prior). Each peer is probed on its own loop, so a peer that never answers does
not delay the others' probes. On the hot path the gateway calls :meth:`PeerTable.usable`
(no I/O) and reports each forward's outcome with :meth:`record_success` /
:meth:`record_failure`, which drive the breaker.

A peer whose last probe or forward failed is not offered again until a probe succeeds,
and a failed probe fires :meth:`Peer.failed`, which forwards still waiting for that
peer's first bytes race against: a peer that goes dark costs the requests already sent
there at most about one probe interval and timeout, not their whole deadline.

In local mode the regions share one host, so the configured RTT is *emulated*: it is
added to every measured sample and every forward waits it out (:attr:`Peer.emulated_ms`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from firstlight.regions.hop import HopSigner
from firstlight.regions.summary import ForwardedWork, RegionSummary

__all__ = [
    "SUMMARY_PATH",
    "CircuitBreaker",
    "Peer",
    "PeerGoneError",
    "PeerTable",
    "while_answering",
]

SUMMARY_PATH = "/v1/firstlight/summary"
"""A gateway's summary for its peers (probed, signed)."""

_Item = TypeVar("_Item")

_log = logging.getLogger(__name__)


class CircuitBreaker:
    """Opens after ``failures`` consecutive failures; after ``cooldown_s`` it lets one
    trial through (half-open); a success closes it, a failure re-opens it."""

    def __init__(
        self,
        failures: int = 3,
        cooldown_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = failures
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_inflight = False

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self._cooldown_s:
            return "half-open"
        return "open"

    def allow(self) -> bool:
        """Whether a request may go to the peer now (claims the half-open trial)."""
        state = self.state
        if state == "closed":
            return True
        if state == "half-open" and not self._trial_inflight:
            self._trial_inflight = True
            return True
        return False

    def success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._trial_inflight = False

    def failure(self) -> None:
        self._failures += 1
        self._trial_inflight = False
        if self._opened_at is not None or self._failures >= self._threshold:
            self._opened_at = self._clock()


@dataclass
class Peer:
    """One peer region as this gateway sees it."""

    region: str
    url: str
    """Base URL of the peer's region endpoint, without a trailing slash."""
    rtt_ms: float
    """Smoothed round trip (prior: the configured value)."""
    emulated_ms: float
    """Delay added to forwards and probes (local mode), 0 for real peers."""
    breaker: CircuitBreaker
    summary: RegionSummary | None = None
    summary_received_at: float | None = None
    last_error: str | None = None
    forwarded: ForwardedWork = field(default_factory=ForwardedWork)
    """Prompt tokens this gateway forwarded to the peer since its last summary whose
    answer has not started (the summary does not show them yet); reset when a new
    summary arrives."""
    _failure: asyncio.Event | None = field(default=None, repr=False, compare=False)

    def failed(self) -> asyncio.Event:
        """An event set when the peer next fails a probe (it does not even answer for
        its summary); a forward waiting for the peer's answer waits on it too. Call it
        on the event loop."""
        if self._failure is None:
            self._failure = asyncio.Event()
        return self._failure

    def release_waiters(self) -> None:
        """Set the :meth:`failed` event (the peer failed a probe); the next call of
        :meth:`failed` gets a fresh one."""
        if self._failure is not None:
            self._failure.set()
            self._failure = None


class PeerGoneError(httpx.TransportError):
    """The peer failed a probe while its answer was being read: raised into the reader
    as a broken connection (an ``httpx`` transport error), so it is handled as one."""


async def while_answering(items: AsyncIterator[_Item], peer: Peer) -> AsyncIterator[_Item]:
    """``items`` (a peer's answer, read as lines or raw bytes) until ``peer`` fails a
    probe (any time after the call, also between two reads); then the read in progress
    is abandoned and :class:`PeerGoneError` raised, rather than waiting out
    ``router.peer_timeout_s`` for a peer that went silent after its answer had started.
    Called by :mod:`firstlight.api.forward` (and its :mod:`firstlight.api._peer_answer`) and
    :func:`firstlight.api.resume.peer_chunks` on every forwarded answer."""
    # Set by the first failed probe from now on; one waiter for the whole answer.
    gone = asyncio.ensure_future(peer.failed().wait())
    try:
        while True:
            read = asyncio.ensure_future(anext(items))
            try:
                await asyncio.wait({read, gone}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # cancelled (the client left): stop reading too
                read.cancel()
                raise
            if not read.done():
                read.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await read
                raise PeerGoneError(f"peer {peer.region} stopped answering its probes")
            try:
                item = read.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        gone.cancel()


class PeerTable:
    """Peers of one region (see the module docstring)."""

    def __init__(
        self,
        peers: list[Peer],
        client: httpx.AsyncClient,
        *,
        signer: HopSigner | None = None,
        probe_interval_s: float = 1.0,
        probe_timeout_s: float = 2.0,
        summary_max_age_s: float = 10.0,
        rtt_alpha: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.peers = {p.region: p for p in peers}
        self._client = client
        self.signer = signer or HopSigner(secrets.token_hex(32), "unconfigured")
        """Signs this region's hops (probes and forwards); the gateway verifies peers'
        with it. Without one, a random key: no peer accepts the hops as signed."""
        self._interval_s = probe_interval_s
        self._timeout_s = probe_timeout_s
        self._max_age_s = summary_max_age_s
        self._alpha = rtt_alpha
        self._clock = clock
        self._probed = asyncio.Event()

    async def run(self) -> None:
        """Probe every peer forever, each on its own loop (cancel to stop); never raises
        for a peer's fault."""
        pending = set(self.peers)
        if not pending:
            self._probed.set()

        async def probe_forever(peer: Peer) -> None:
            while True:
                await self.probe(peer)
                pending.discard(peer.region)
                if not pending:
                    self._probed.set()
                await asyncio.sleep(self._interval_s)

        await asyncio.gather(*(probe_forever(p) for p in self.peers.values()))

    async def wait_probed(self) -> None:
        """Until the first round of probes finished (start-up, tests)."""
        await self._probed.wait()

    async def probe(self, peer: Peer) -> None:
        """Fetch ``peer``'s summary once; update its RTT, summary and breaker."""
        started = self._clock()
        try:
            response = await self._client.get(
                f"{peer.url}{SUMMARY_PATH}",
                headers=self.signer.sign(SUMMARY_PATH),
                timeout=self._timeout_s,
            )
            response.raise_for_status()
            summary = RegionSummary.from_json(response.json())
        except Exception as exc:  # a peer's fault never stops the probe loop
            self.record_failure(peer, f"{type(exc).__name__}: {exc}")
            peer.release_waiters()  # not even its summary answers: forwards waiting give up
            return
        sample = (self._clock() - started) * 1000.0 + peer.emulated_ms
        peer.rtt_ms = (1 - self._alpha) * peer.rtt_ms + self._alpha * sample
        peer.summary = summary
        peer.summary_received_at = self._clock()
        peer.forwarded.reset()
        peer.last_error = None
        peer.breaker.success()

    def usable(self, model: str) -> list[Peer]:
        """Peers whose fresh summary shows a healthy ``model``, whose last probe or
        forward did not fail and whose breaker is not open (no I/O; called per
        request)."""
        now = self._clock()
        found = []
        for peer in self.peers.values():
            if peer.last_error is not None:
                continue
            summary = peer.summary
            if summary is None or peer.summary_received_at is None:
                continue
            if now - peer.summary_received_at > self._max_age_s:
                continue
            entry = summary.models.get(model)
            if entry is None or entry.healthy_replicas < 1:
                continue
            if peer.breaker.state == "open":
                continue
            found.append(peer)
        return found

    def is_up(self, peer: Peer) -> bool:
        """Whether ``peer`` answers: a fresh summary, no failure since, and a breaker
        that is not open (metrics and the dashboard; no I/O)."""
        received = peer.summary_received_at
        fresh = received is not None and self._clock() - received <= self._max_age_s
        return fresh and peer.last_error is None and peer.breaker.state != "open"

    def summary_age_s(self, peer: Peer) -> float | None:
        """Seconds since ``peer``'s last summary arrived; ``None`` if none ever did."""
        received = peer.summary_received_at
        return None if received is None else self._clock() - received

    def record_success(self, peer: Peer) -> None:
        """A forward to ``peer`` was answered: proof of life, like a good probe."""
        peer.last_error = None
        peer.breaker.success()

    def record_failure(self, peer: Peer, error: str) -> None:
        """A probe or a forward to ``peer`` failed: the breaker counts it and the peer
        is not offered until a probe succeeds. (A forward's failure does not abandon the
        other forwards waiting on the peer: it answered, so it is alive.)"""
        peer.last_error = error
        peer.breaker.failure()


async def stop(task: asyncio.Task[None]) -> None:
    """Cancel a peer table's probe task and wait for it."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
