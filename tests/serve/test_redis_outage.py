"""Redis stops under steady load and comes back. Nothing fails: every answer, streamed
and not, is checked whole (text, usage, ``[DONE]``, no error event); while Redis is
down ``/readyz`` reports the hint feed ``stale`` and routing falls back to what needs no
Redis — each replica's queue depth, priced by the cost model (``x-firstlight-decision``
ranks both replicas), and the hint mirror the gateway had (a prompt it held before the
outage is still priced as cached). The hint feed reconnects once Redis is back (time to
resync reported). A private ``redis-server`` on a free port (never the machine's shared
one); real local Ray cluster, ``sim`` engines."""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from firstlight.serve.local_mode import start_local, stop_local
from firstlight_bench.clients.closed_loop import ClosedLoop, HttpxSender
from tests.hints.conftest import RedisServer
from tests.serve.cluster import API_KEY, platform_config, sim_model
from tests.serve.faults_checks import PricedDecision, RecordingTransport, parse_decision

MODEL = "sim-outage"
REGION = "rd-east"
WORKERS = 3
REPLICAS = 2
DURING_OUTAGE = 20
"""Requests to serve between the gateway noticing the outage and Redis's return."""
SHARED = "A system prompt the gateway saw before the outage, long enough for blocks. " * 8
HEADERS = {"authorization": f"Bearer {API_KEY}"}


async def _readiness(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        # The test key is an operator key too: /readyz's detail is for operators.
        ready: dict[str, Any] = (await client.get(f"{base}/readyz", headers=HEADERS)).json()
    return ready


async def _hints(base: str) -> dict[str, Any]:
    hints: dict[str, Any] = (await _readiness(base))["hints"][MODEL]
    return hints


async def _until(condition: str, base: str, within_s: float) -> float:
    """Seconds until the hint feed's status starts with ``condition`` (polled)."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if (await _hints(base))["status"].startswith(condition):
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"hints never became {condition!r}: {await _hints(base)!r}")


async def _shared_until_cached(base: str, within_s: float) -> PricedDecision:
    """Send the shared prompt until its routing decision prices some of it as cached
    (the hint mirror holds its blocks); each answer is checked. Polled under a deadline:
    the first send puts the blocks in a replica, the feed brings their hint."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": SHARED}], "max_tokens": 2}
    url = f"{base}/v1/chat/completions"
    started = time.monotonic()
    seen: list[str | None] = []
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        while time.monotonic() - started < within_s:
            response = await client.post(url, json=body, headers=HEADERS)
            assert response.status_code == 200, response.text
            answer = response.json()
            assert answer["choices"][0]["message"]["content"], answer
            assert answer["usage"]["completion_tokens"] == 2, answer
            seen.append(response.headers.get("x-firstlight-decision"))
            decision = parse_decision(seen[-1])
            if decision is not None and decision.cached_tokens > 0:
                return decision
            await asyncio.sleep(0.1)
    raise AssertionError(f"the shared prompt was never priced as cached: {seen}")


@pytest.mark.slow
async def test_no_request_fails_while_redis_is_down_and_hints_resync(
    serve_port: int,
    key_file: Path,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    redis = RedisServer(tmp_path)  # its own port: the machine's Redis is left alone
    await redis.start()
    config = platform_config(
        serve_port,
        [{"name": REGION}],
        [sim_model(MODEL, replicas=REPLICAS)],
        key_file=key_file,
        extra={"hints": {"redis_url": redis.url, "key_prefix": f"fltest.{uuid.uuid4().hex[:8]}."}},
    )
    platform = await asyncio.to_thread(start_local, config, timeout_s=120)
    base = platform.endpoints[REGION]
    recorder = RecordingTransport()
    sender = HttpxSender(base, api_key=API_KEY, transport=recorder)
    load = ClosedLoop(sender, MODEL, clients=WORKERS, max_tokens=8)
    try:
        await _until("connected", base, within_s=30)
        primed = await _shared_until_cached(base, within_s=30)  # the mirror holds it
        load.start()
        origin = load.origin  # the answers' time base, on the monotonic clock
        await load.wait_for(10)
        await redis.stop()
        noticed_s = await _until("stale", base, within_s=30)
        stale_at = load.now_s()
        # Served without Redis (the requests in flight at the notice not counted).
        await load.wait_for(len(load.answers) + WORKERS + DURING_OUTAGE)
        mirror = await _hints(base)
        during_shared = await _shared_until_cached(base, within_s=10)
        still = await _hints(base)
        assert still["status"].startswith("stale"), still  # all of it happened without Redis
        restart_at = load.now_s()
        await redis.start()
        resync_s = await _until("connected", base, within_s=60)
        await load.wait_for(len(load.answers) + 10)
        answers = await load.stop()
    finally:
        await load.stop()
        await recorder.close()
        await asyncio.to_thread(stop_local, platform)
        await redis.stop()

    lost = [a for a in answers if a.lost]
    assert lost == [], collections.Counter(a.outcome.error for a in lost)
    during = [a for a in answers if a.outcome.arrival_s >= stale_at and a.ended_s <= restart_at]
    record_property("requests", len(answers))
    record_property("lost", len(lost))
    record_property("during", len(during))
    record_property("stale_after_s", noticed_s)
    record_property("reconnect_s", resync_s)
    assert len(during) >= DURING_OUTAGE, len(during)
    assert {a.stream for a in during} == {True, False}, "both kinds served without Redis"

    # Routing without Redis: each request still priced by the cost model from the
    # replicas' own stats (their queues), both replicas ranked and both serving, and the
    # mirror it had still in use.
    exchanges = recorder.between(origin + stale_at, origin + restart_at)
    assert len(exchanges) >= DURING_OUTAGE
    decisions = [parse_decision(e.header("x-firstlight-decision")) for e in exchanges]
    priced = [d for d in decisions if d is not None]
    record_property("priced", len(priced))
    record_property("decisions", len(exchanges))
    assert len(priced) >= 0.75 * len(exchanges), [
        e.header("x-firstlight-decision") for e in exchanges
    ]
    assert all(d.policy == config.router.policy for d in priced), priced
    assert all(d.runner_up is not None for d in priced), priced
    served_by = collections.Counter(e.header("x-firstlight-replica") for e in exchanges)
    assert len(served_by) == REPLICAS, served_by
    assert mirror["status"].startswith("stale"), mirror
    assert mirror["blocks"] > 0, f"the hint mirror was emptied when Redis went: {mirror}"
    assert during_shared.cached_tokens > 0  # priced from the mirror, without Redis

    waited = sum(d.wait_ms > 0 for d in priced)
    print(
        f"\nRedis stopped under load ({WORKERS} clients, {REPLICAS} replicas): "
        f"{len(answers)} requests, 0 failed, every answer checked; {len(during)} served "
        f"while Redis was down ({sum(a.stream for a in during)} streamed); /readyz said "
        f"stale {noticed_s:.1f} s after the stop; without Redis {len(priced)} of "
        f"{len(exchanges)} decisions priced by the cost model ({waited} with a queue wait), "
        f"served by {dict(served_by)}; mirror kept {mirror['blocks']} blocks, the shared "
        f"prompt priced {during_shared.cached_tokens} tokens cached on "
        f"{during_shared.replica} (before: {primed.cached_tokens} on {primed.replica}); "
        f"hint feed reconnected {resync_s:.1f} s after Redis came back"
    )
