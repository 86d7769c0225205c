"""A peer region that goes dark — it accepts connections but never answers — while the
local region is spilling requests over to it. The peer is reached through a fault
injector (a loopback TCP relay in this test) that passes traffic through until told to
swallow it: new connections and the ones already open then get no answer at all.

Nothing is lost and the local region does not inherit the peer's silence: requests
already forwarded give up as soon as the peer fails a probe (not after
``router.peer_timeout_s``, set to a minute here), the peer is no longer offered, and
the local p99 is reported beside the healthy-peer phase of the same run. Real local Ray
cluster, two emulated regions, ``sim`` engines (the default model's CPU costs, so a
busy replica makes spill-over worthwhile)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from firstlight.telemetry.rolling import percentile
from firstlight_bench.steady import Answer, SteadyLoad
from tests.serve.cluster import API_KEY, free_port, platform_config, sim_model

MODEL = "sim-blackhole"
EAST, WEST = "hole-east", "hole-west"
PEER_TIMEOUT_S = 60.0
PHASE_REQUESTS = 100


class FaultRelay:
    """Relays TCP connections from ``port`` to ``upstream_port`` on loopback until
    :meth:`go_dark`; from then on it reads what arrives and answers nothing."""

    def __init__(self, port: int, upstream_port: int) -> None:
        self.port = port
        self.dark = asyncio.Event()
        self._upstream_port = upstream_port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def go_dark(self) -> None:
        self.dark.set()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self.dark.is_set():
                while await reader.read(65536):
                    pass  # swallowed
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
            try:
                await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
            finally:
                up_writer.close()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self.dark.is_set():
                await asyncio.Event().wait()  # silence, connection held open
            writer.write(data)
            await writer.drain()
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
    regions: LocalPlatform, relay_port: int, serve_port: int
) -> None:
    relay = FaultRelay(relay_port, serve_port)
    await relay.start()
    try:
        await _run(regions, relay)
    finally:
        await relay.close()


async def _run(regions: LocalPlatform, relay: FaultRelay) -> None:
    east = regions.endpoints[EAST]
    await _until_peer(east, up=True, within_s=60)  # the first probe through the relay
    load = SteadyLoad(east, MODEL, clients=2, max_tokens=8, prompt_words=40, api_key=API_KEY)
    load.start()
    await load.wait_for(PHASE_REQUESTS)
    relay.go_dark()
    dark_at = load.now_s()
    await _until_peer(east, up=False, within_s=60)
    detected_at = load.now_s()
    await load.wait_for(len(load.answers) + PHASE_REQUESTS)
    answers = await load.stop()

    lost = [a for a in answers if a.lost]
    assert lost == [], collections.Counter(a.problem for a in lost)
    healthy = [a for a in answers if a.started_s + a.total_s < dark_at]
    caught = [a for a in answers if a.started_s < dark_at < a.started_s + a.total_s]
    dark = [a for a in answers if a.started_s >= detected_at]
    assert any(a.route == "spill-over" for a in healthy), "nothing spilled: the test is moot"
    assert all(a.route == "local" for a in dark), collections.Counter(a.route for a in dark)
    slowest_caught_s = max((a.total_s for a in caught), default=0.0)
    assert slowest_caught_s < PEER_TIMEOUT_S / 2, "a forward waited for the dark peer's timeout"
    print(
        f"\npeer {WEST} went dark under load ({load.clients} clients, {len(answers)} requests, "
        f"0 lost): detected {detected_at - dark_at:.1f} s later; "
        f"{_phase(healthy)} with the peer healthy "
        f"({sum(a.route == 'spill-over' for a in healthy)} spilled), {_phase(dark)} with it "
        f"dark; {len(caught)} requests in flight at the switch, slowest "
        f"{slowest_caught_s:.2f} s"
    )


async def _until_peer(base: str, *, up: bool, within_s: float) -> None:
    """Until the gateway at ``base`` shows west as ``up`` (polled under a deadline)."""
    async with asyncio.timeout(within_s):
        while True:
            if (await _peer_state(base))["up"] == up:
                return
            await asyncio.sleep(0.05)


def _phase(answers: list[Answer]) -> str:
    ttfts = sorted(a.ttft_s * 1000 for a in answers if a.ttft_s is not None)
    p50, p95, p99 = (percentile(ttfts, q) or 0.0 for q in (0.5, 0.95, 0.99))
    return f"TTFT p50 {p50:.0f} / p95 {p95:.0f} / p99 {p99:.0f} ms over {len(answers)} requests"
