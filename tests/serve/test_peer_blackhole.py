"""A peer region that goes dark — it accepts connections but never answers — while the
local region is spilling requests over to it. The peer is reached through a fault
injector (a loopback TCP relay in this test) that passes traffic through until it goes
dark: new connections and the ones already open then get no answer at all.

The relay follows the HTTP exchanges it carries, and goes dark at the moment the gateway
forwards a chat completion while no forwarded answer is part-way through: so at least
one request is caught in flight, waiting for the peer's first bytes — the case the
probe-based give-up exists for — and none is caught mid-answer (a forward whose answer
already started waits up to ``router.peer_timeout_s`` for each chunk, as
docs/reliability.md says; that is not what this row measures).

Nothing is lost and the local region does not inherit the peer's silence: the requests
caught give up as soon as the peer fails a probe (not after ``router.peer_timeout_s``,
set to a minute here) and are served locally, the peer is no longer offered, and the
local p99 with the peer dark stays near the healthy-peer phase of the same run. Real
local Ray cluster, two emulated regions, ``sim`` engines (the default model's CPU costs,
so a busy replica makes spill-over worthwhile)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import h11
import httpx
import pytest

from firstlight._ports import free_port
from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from firstlight_bench.clients.closed_loop import Answer, ClosedLoop, HttpxSender
from tests.serve.cluster import API_KEY, platform_config, sim_model
from tests.serve.faults_checks import RecordingTransport, request_number, ttft_percentiles_ms

MODEL = "sim-blackhole"
EAST, WEST = "hole-east", "hole-west"
PEER_TIMEOUT_S = 60.0
PHASE_REQUESTS = 100
GIVE_UP_S = PEER_TIMEOUT_S / 6
"""Bound on the detection and on each caught request: the probe loop notices a silent
peer within its interval plus its timeout (1 + 2 s) and a local answer takes about a
second, while a forward left to its timeout takes ``PEER_TIMEOUT_S``."""
DARK_P99_RATIO = 1.5
"""Local TTFT p99 with the peer dark over the healthy phase's, same run. The dark phase
carries the whole load locally (the healthy peer took a quarter to a half of it), which
moves the p50 but hardly the p99 (2 closed-loop clients: at most two requests queue
either way); a dark peer that leaked into local requests adds its probe timeout (2 s)
or more to them."""


@dataclass
class Forwarded:
    """One HTTP request the gateway sent through the relay."""

    method: str
    target: str
    number: int | None = None
    """The closed-loop request it carries (``None``: a probe)."""
    answered: bool = False
    """Some of the peer's answer was relayed back."""

    @property
    def is_forward(self) -> bool:
        return self.method == "POST" and self.target.endswith("/chat/completions")


class _Sniffer:
    """Follows one relayed HTTP/1.1 connection (the gateway's client does not pipeline):
    its requests, and whether an answer is part-way through (some relayed, not its end).
    Parses copies of the bytes; the relay passes the originals on unchanged."""

    def __init__(self) -> None:
        self.requests: list[Forwarded] = []
        self.answering: Forwarded | None = None
        self.closed = False
        self._reading = h11.Connection(h11.SERVER)
        self._answers = h11.Connection(h11.CLIENT)
        self._body = bytearray()

    def from_gateway(self, data: bytes) -> list[Forwarded]:
        """Requests whose head arrived in ``data``."""
        started = []
        self._reading.receive_data(data)
        while True:
            event = self._reading.next_event()
            if isinstance(event, h11.Request):
                started.append(Forwarded(event.method.decode(), event.target.decode()))
                self.requests.append(started[-1])
                self._body.clear()
                # The answer parser must expect an answer: it is told of a request.
                self._answers.send(
                    h11.Request(method=event.method, target=event.target, headers=[("host", "p")])
                )
                self._answers.send(h11.EndOfMessage())
            elif isinstance(event, h11.Data):
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                self.requests[-1].number = request_number(bytes(self._body))
                # A fresh parser for the next request (this one waits for our answer).
                leftover, closed = self._reading.trailing_data
                self._reading = h11.Connection(h11.SERVER)
                if leftover:
                    self._reading.receive_data(leftover)
                if closed:
                    self._reading.receive_data(b"")
            else:  # NEED_DATA, ConnectionClosed
                return started

    def from_peer(self, data: bytes) -> None:
        pending = next((r for r in self.requests if not r.answered), None)
        if pending is not None:
            pending.answered = True
            self.answering = pending
        self._answers.receive_data(data)
        while True:
            event = self._answers.next_event()
            if isinstance(event, h11.EndOfMessage):
                self.answering = None
                if self._answers.our_state is h11.DONE and self._answers.their_state is h11.DONE:
                    self._answers.start_next_cycle()
            elif not isinstance(event, h11.Response | h11.Data):
                return


class FaultRelay:
    """Relays TCP connections from ``port`` to ``upstream_port`` on loopback until it
    goes dark (:meth:`arm`); from then on it reads what arrives and answers nothing."""

    def __init__(self, port: int, upstream_port: int) -> None:
        self.port = port
        self.dark = asyncio.Event()
        self.dark_at: float | None = None
        """``time.monotonic()`` when it went dark."""
        self.caught_at_switch: list[Forwarded] = []
        """Forwards waiting for their first bytes when it went dark."""
        self._armed = False
        self._upstream_port = upstream_port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._sniffers: list[_Sniffer] = []
        self.errors: list[Exception] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def arm(self) -> None:
        """Go dark when the gateway next forwards a chat completion while no forward's
        answer is part-way through: that request, at least, is caught in flight."""
        self._armed = True

    def answering(self) -> list[Forwarded]:
        """Forwards whose answer is part-way through the relay."""
        return [
            s.answering
            for s in self._sniffers
            if not s.closed and s.answering is not None and s.answering.is_forward
        ]

    def describe(self) -> str:
        seen = [r for s in self._sniffers for r in s.requests]
        return (
            f"{len(self._sniffers)} connections, {len(seen)} requests "
            f"({sum(r.is_forward for r in seen)} forwards), answering {self.answering()}, "
            f"errors {self.errors!r}"
        )

    def caught(self) -> list[Forwarded]:
        """Every forward never answered: those waiting at the switch, and those sent
        after it (before the gateway noticed)."""
        return [r for s in self._sniffers for r in s.requests if r.is_forward and not r.answered]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _go_dark(self) -> None:
        self.dark.set()
        self.dark_at = time.monotonic()
        self.caught_at_switch = self.caught()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        sniffer = _Sniffer()
        self._sniffers.append(sniffer)
        try:
            if self.dark.is_set():
                await self._from_gateway(reader, None, sniffer)
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
            try:
                await asyncio.gather(
                    self._from_gateway(reader, up_writer, sniffer),
                    self._from_peer(up_reader, writer, sniffer),
                )
            finally:
                up_writer.close()
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception as exc:  # the relay's own fault: the test reports it
            self.errors.append(exc)
        finally:
            sniffer.closed = True
            writer.close()
            self._tasks.discard(task)

    async def _from_gateway(
        self, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter | None, sniffer: _Sniffer
    ) -> None:
        while data := await reader.read(65536):
            started = sniffer.from_gateway(data)
            if (
                self._armed
                and not self.dark.is_set()
                and any(r.is_forward for r in started)
                and not self.answering()
            ):
                self._go_dark()
            if upstream is None or self.dark.is_set():
                continue  # swallowed
            upstream.write(data)
            await upstream.drain()
        if upstream is not None and not self.dark.is_set():
            with contextlib.suppress(OSError):
                upstream.write_eof()

    async def _from_peer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sniffer: _Sniffer
    ) -> None:
        while data := await reader.read(65536):
            if self.dark.is_set():
                continue  # swallowed: the peer's answers never arrive
            sniffer.from_peer(data)
            writer.write(data)
            await writer.drain()
        if not self.dark.is_set():
            with contextlib.suppress(OSError):
                writer.write_eof()


@pytest.fixture(scope="module")
def relay_port() -> int:
    """Where east reaches west: the relay listens there once the test starts it (until
    then east's probes are refused and west is not offered)."""
    return free_port()


@pytest.fixture(scope="module")
def regions(serve_port: int, key_file: Path, relay_port: int) -> Iterator[LocalPlatform]:
    west_url = f"http://127.0.0.1:{relay_port}/{WEST}"
    config = platform_config(
        serve_port,
        [
            {"name": EAST, "peers": [{"region": WEST, "rtt_ms": 5, "url": west_url}]},
            {"name": WEST, "peers": [{"region": EAST, "rtt_ms": 5}]},
        ],
        [sim_model(MODEL, replicas=1)],
        key_file=key_file,
        extra={"router": {"spill_over_margin_ms": 20, "peer_timeout_s": PEER_TIMEOUT_S}},
    )
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


async def _peer_state(base: str) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        state = (
            await client.get(
                f"{base}/dashboard/api/state", headers={"authorization": f"Bearer {API_KEY}"}
            )
        ).json()
    peer: dict[str, object] = next(r for r in state["regions"] if r["name"] == WEST)
    return peer


@pytest.mark.slow
async def test_a_peer_that_goes_dark_costs_the_local_region_nothing(
    regions: LocalPlatform,
    relay_port: int,
    serve_port: int,
    record_property: Callable[[str, object], None],
) -> None:
    assert regions.config.router.peer_timeout_s == PEER_TIMEOUT_S
    relay = FaultRelay(relay_port, serve_port)
    recorder = RecordingTransport()
    await relay.start()
    try:
        await _run(regions, relay, recorder, record_property)
    finally:
        await relay.close()
        await recorder.close()


async def _run(
    regions: LocalPlatform,
    relay: FaultRelay,
    recorder: RecordingTransport,
    record_property: Callable[[str, object], None],
) -> None:
    east = regions.endpoints[EAST]
    await _until_peer(east, up=True, within_s=60)  # the first probe through the relay
    sender = HttpxSender(east, api_key=API_KEY, transport=recorder)
    load = ClosedLoop(sender, MODEL, clients=2, max_tokens=8, prompt_words=40)
    load.start()
    origin = load.origin  # the answers' time base, on the monotonic clock
    await load.wait_for(PHASE_REQUESTS)
    relay.arm()
    try:
        async with asyncio.timeout(60):  # a spill-over comes along (a third of the load did)
            await relay.dark.wait()
    except TimeoutError:
        raise AssertionError(f"the relay never went dark: {relay.describe()}") from None
    assert relay.dark_at is not None
    dark_at = relay.dark_at - origin
    await _until_peer(east, up=False, within_s=60)
    detected_at = load.now_s()
    await load.wait_for(len(load.answers) + PHASE_REQUESTS)
    answers = await load.stop()

    lost = [a for a in answers if a.lost]
    assert lost == [], collections.Counter(a.outcome.error for a in lost)
    assert relay.errors == []
    healthy = [a for a in answers if a.ended_s < dark_at]
    dark = [a for a in answers if a.outcome.arrival_s >= detected_at]
    healthy_p = ttft_percentiles_ms(healthy)
    dark_p = ttft_percentiles_ms(dark)
    spilled = sum(a.route == "spill_over" for a in healthy)
    figures = {
        "requests": len(answers),
        "lost": len(lost),
        "detect_s": detected_at - dark_at,
        "healthy_p50_ms": healthy_p[0],
        "healthy_p99_ms": healthy_p[2],
        "dark_p50_ms": dark_p[0],
        "dark_p99_ms": dark_p[2],
        "p99_ratio": dark_p[2] / healthy_p[2],
        "spilled_share": spilled / len(healthy) if healthy else 0.0,
        "peer_timeout_s": PEER_TIMEOUT_S,
    }
    for name, value in figures.items():
        record_property(name, value)  # firstlight bench faults stores them
    assert any(a.route == "spill_over" for a in healthy), "nothing spilled: the test is moot"
    assert detected_at - dark_at < GIVE_UP_S, f"peer marked down {detected_at - dark_at:.1f} s late"
    # The peer is no longer offered once it failed a probe.
    assert all(a.route == "local" for a in dark), collections.Counter(a.route for a in dark)

    # At least one request was in flight to the peer when it went dark (the relay went
    # dark on a forward), and each caught one gave up at the failed probe: served here,
    # within moments of the detection, far below the peer timeout.
    caught = relay.caught()
    assert relay.caught_at_switch, "the relay went dark with no forward in flight"
    exchanges = recorder.by_number()
    slowest_dark_s = max(a.ended_s - a.outcome.arrival_s for a in dark)
    caught_s = []
    for forwarded in caught:
        assert forwarded.number is not None, forwarded
        exchange = exchanges[forwarded.number]
        assert exchange.status == 200, exchange
        assert exchange.header("x-firstlight-region") == EAST, exchange.headers
        assert exchange.header("x-firstlight-route") == "local", exchange.headers
        assert exchange.total_s is not None
        assert exchange.closed_at is not None
        caught_s.append(exchange.total_s)
        assert exchange.total_s < GIVE_UP_S, f"request {forwarded.number} waited for the peer"
        # Given up at the detection: it ended within a local answer's time after it
        # (twice the slowest of the dark phase, for the queue it joined at that moment).
        after_detection_s = exchange.closed_at - origin - detected_at
        assert after_detection_s < 2 * slowest_dark_s + 0.5, (after_detection_s, slowest_dark_s)

    record_property("caught", len(caught))
    record_property("caught_max_s", max(caught_s))
    print(
        f"\npeer {WEST} went dark under load ({load.clients} clients, {len(answers)} requests, "
        f"0 lost): detected {detected_at - dark_at:.2f} s later; local TTFT {_phase(healthy)} "
        f"with the peer healthy ({spilled} of {len(healthy)} spilled, "
        f"{spilled / len(healthy):.0%}) vs {_phase(dark)} with it dark (p99 ratio "
        f"{dark_p[2] / healthy_p[2]:.2f}); {len(caught)} requests caught in flight to the peer "
        f"({len(relay.caught_at_switch)} at the switch), served locally in at most "
        f"{max(caught_s):.2f} s (peer timeout {PEER_TIMEOUT_S:.0f} s)"
    )
    assert dark_p[2] <= DARK_P99_RATIO * healthy_p[2], (dark_p, healthy_p)


async def _until_peer(base: str, *, up: bool, within_s: float) -> None:
    """Until the gateway at ``base`` shows west as ``up`` (polled under a deadline)."""
    async with asyncio.timeout(within_s):
        while True:
            if (await _peer_state(base))["up"] == up:
                return
            await asyncio.sleep(0.05)


def _phase(answers: list[Answer]) -> str:
    p50, p95, p99 = ttft_percentiles_ms(answers)
    return f"p50 {p50:.0f} / p95 {p95:.0f} / p99 {p99:.0f} ms over {len(answers)} requests"
