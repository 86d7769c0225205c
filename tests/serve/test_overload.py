"""Overload: requests offered at twice a region's capacity. With
``router.admission_wait_ms`` the gateway refuses what would queue too long — fast, 503
with ``Retry-After`` — and the admitted requests keep a bounded time to first token,
reported against the region's TTFT objective (``router.slo.ttft_p95_ms``); the gateway's
own bound (``gateway.max_in_flight``) refuses the excess at once. Real local Ray cluster;
one ``sim`` replica with the default model's CPU costs (about 860 prefill tokens/s, so a
500-token prompt is ~0.6 s of work, ~0.8 s with its attention and step overhead)."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from firstlight.api.sse import sse_events
from firstlight.quantiles import percentile
from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from tests.serve.cluster import API_KEY, platform_config, sim_model

MODEL = "sim-overload"
BOUND_MS = 1000.0
SLO_MS = 2000.0
"""The objective of this CPU region: the admission bound plus one request's prefill."""
MAX_TOKENS = 2
REQUESTS = 28
CAPACITY_PER_S = 860 / 520  # prefill-bound: ~520 prompt tokens per request (nominal)
OFFERED_PER_S = 2 * CAPACITY_PER_S


@dataclass(frozen=True)
class Outcome:
    status: int
    seconds: float
    """Until the first token (admitted) or the refusal (shed)."""
    retry_after: str | None
    code: str | None


@pytest.fixture(scope="module")
def overloaded(serve_port: int, key_file: Path) -> Iterator[LocalPlatform]:
    config = platform_config(
        serve_port,
        [{"name": "ovl-east"}],
        [sim_model(MODEL, replicas=1)],
        key_file=key_file,
        extra={
            "router": {"admission_wait_ms": BOUND_MS, "slo": {"ttft_p95_ms": SLO_MS}},
            "gateway": {"host": "127.0.0.1", "port": serve_port, "max_in_flight": 12},
        },
    )
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


async def _one(client: httpx.AsyncClient, url: str, i: int) -> Outcome:
    body = {
        "model": MODEL,
        # Distinct from the first token: no request reuses another's cached prefix.
        "messages": [{"role": "user", "content": f"{i:03d} " + "lorem ipsum dolor " * 27}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"authorization": f"Bearer {API_KEY}"}
    started = time.monotonic()
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            seconds = time.monotonic() - started
            code = response.json()["error"]["code"]
            return Outcome(response.status_code, seconds, response.headers.get("retry-after"), code)
        # An admitted answer is checked whole: text, usage, [DONE], no error event.
        ttft_s: float | None = None
        done, tokens = False, None
        async for event in sse_events(response.aiter_lines()):
            if event is None:
                done = True
                continue
            assert "error" not in event, event
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if ttft_s is None and any(c["delta"].get("content") for c in event["choices"]):
                ttft_s = time.monotonic() - started
    assert ttft_s is not None, "an admitted stream without text"
    assert done, "an admitted stream without [DONE]"
    assert tokens == MAX_TOKENS, tokens
    return Outcome(200, ttft_s, None, None)


async def _offer(endpoint: str, per_s: float, count: int) -> list[Outcome]:
    """Open-loop arrivals every 1/per_s seconds (the pacing is the load, not a wait for
    a result)."""
    url = f"{endpoint}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=60) as client:
        tasks = []
        for i in range(count):
            tasks.append(asyncio.create_task(_one(client, url, i)))
            await asyncio.sleep(1 / per_s)
        return list(await asyncio.gather(*tasks))


@pytest.mark.slow
async def test_twice_the_capacity_is_shed_fast_and_admitted_requests_keep_their_latency(
    overloaded: LocalPlatform, record_property: Callable[[str, object], None]
) -> None:
    router = overloaded.config.router
    assert router.admission_wait_ms == BOUND_MS
    objective_ms = router.slo.ttft_p95_ms
    outcomes = await _offer(overloaded.endpoints["ovl-east"], OFFERED_PER_S, REQUESTS)
    admitted = [o for o in outcomes if o.status == 200]
    shed = [o for o in outcomes if o.status != 200]
    # Half the offer is beyond capacity: a gateway that sheds nothing, or nearly
    # everything, fails one of these.
    assert len(admitted) >= REQUESTS // 4, f"only {len(admitted)} of {REQUESTS} admitted"
    assert len(shed) >= REQUESTS // 4, f"only {len(shed)} of {REQUESTS} shed at 2x capacity"
    for outcome in shed:
        assert outcome.status == 503
        assert outcome.code == "overloaded"
        assert outcome.retry_after is not None
        assert int(outcome.retry_after) >= 1
    ttft_ms = sorted(o.seconds * 1000 for o in admitted)
    shed_ms = sorted(o.seconds * 1000 for o in shed)
    p50, p99 = statistics.median(ttft_ms), percentile(ttft_ms, 0.99) or 0.0
    p95 = percentile(ttft_ms, 0.95) or 0.0
    figures = {
        "requests": REQUESTS,
        "offered_per_s": OFFERED_PER_S,
        "admitted": len(admitted),
        "shed": len(shed),
        # Neither served whole (an admitted answer is checked by _one) nor refused at once.
        "lost": sum(o.status not in (200, 503) for o in outcomes),
        "shed_p50_ms": statistics.median(shed_ms) if shed_ms else None,
        "shed_max_ms": shed_ms[-1] if shed_ms else None,
        "ttft_p50_ms": p50,
        "ttft_p99_ms": p99,
        "objective_ms": objective_ms,
        "bound_ms": BOUND_MS,
    }
    for name, value in figures.items():
        record_property(name, value)  # firstlight bench faults stores them
    print(
        f"\n{REQUESTS} requests at {OFFERED_PER_S:.1f}/s (2x capacity): {len(admitted)} "
        f"admitted, {len(shed)} shed (503 overloaded); shed answered in p50 "
        f"{statistics.median(shed_ms):.0f} ms, max {shed_ms[-1]:.0f} ms; admitted TTFT p50 "
        f"{p50:.0f} ms, p95 {p95:.0f} ms, p99 {p99:.0f} ms, max {ttft_ms[-1]:.0f} ms "
        f"(objective router.slo.ttft_p95_ms = {objective_ms:.0f} ms)"
    )
    # The claim: what is admitted meets the region's objective, a p95 (the percentile
    # the objective names, not a stricter one: with a dozen admitted requests the p99 is
    # nearly the slowest one, which a busy shared machine delays). Without shedding,
    # 28 requests of ~0.8 s of prefill each arriving over 8.5 s leave the last ones
    # seconds beyond it.
    assert p95 <= objective_ms, ttft_ms
    # Refused at once, not after queueing: a refusal that had waited for its turn would
    # take at least the admission bound; and refusing is far cheaper than serving.
    assert shed_ms[-1] < BOUND_MS / 2, shed_ms
    assert statistics.median(shed_ms) < p50 / 5, (shed_ms, ttft_ms)


@pytest.fixture(scope="module")
def small_gateway(serve_port: int, key_file: Path) -> Iterator[LocalPlatform]:
    """No admission bound, but a gateway that holds at most 4 requests."""
    config = platform_config(
        serve_port,
        [{"name": "ovl-small"}],
        [sim_model(MODEL)],
        key_file=key_file,
        extra={"gateway": {"host": "127.0.0.1", "port": serve_port, "max_in_flight": 4}},
    )
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


@pytest.mark.slow
async def test_the_gateway_bound_refuses_the_excess_at_once(
    small_gateway: LocalPlatform, record_property: Callable[[str, object], None]
) -> None:
    """A gateway bounded to 4 requests, holding 4 streams: the next six are refused with
    503 (gateway.max_in_flight) without waiting; once the streams close, a request is
    served again. The held streams are open until the test closes them, so nothing here
    depends on how fast the machine is."""
    url = f"{small_gateway.endpoints['ovl-small']}/v1/chat/completions"
    headers = {"authorization": f"Bearer {API_KEY}"}
    long = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    short = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    readers = []  # kept referenced: a reader that is collected closes its stream
    async with httpx.AsyncClient(timeout=60) as client, contextlib.AsyncExitStack() as held:
        for _ in range(4):
            stream = await held.enter_async_context(
                client.stream("POST", url, json={**long, "max_tokens": 2000}, headers=headers)
            )
            assert stream.status_code == 200
            readers.append(stream.aiter_lines())
            assert (await anext(readers[-1])).startswith("data: ")  # in flight at the gateway
        refused = [await client.post(url, json=short, headers=headers) for _ in range(6)]
        record_property("held", len(readers))
        record_property("refused", sum(r.status_code == 503 for r in refused))
        record_property("lost", sum(r.status_code not in (200, 503) for r in refused))
        assert [r.status_code for r in refused] == [503] * 6
        assert all("gateway.max_in_flight" in r.json()["error"]["message"] for r in refused)
        assert all(r.headers.get("retry-after") for r in refused)
    # The closed streams free their slots once the gateway sees the disconnect.
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(100):
            served = await client.post(url, json=short, headers=headers)
            if served.status_code != 503:
                break
            await asyncio.sleep(0.1)
    assert served.status_code == 200, served.text
