"""The serving benchmark's gateway phases: capacity per gateway count, and one gateway
killed under load.

Who calls what: :func:`firstlight_bench.tools.serving.serving` deploys the region once per
gateway count and calls :func:`capacity_block` for each (in A B B A order, so that a
drift of the machine touches both counts alike), then :func:`kill_one_gateway` on the
region with the most gateways. The statistics are pure, in
:mod:`firstlight_bench.reports.serving_report`.

* Capacity: closed-loop clients (asyncio + httpx in this process, sharing the cores with
  Ray) send non-streamed chat completions (short prompt, ``max_tokens=1``) for a fixed
  time per concurrency level; beside each level's requests/s the cores each group of
  processes used (:mod:`firstlight_bench.tools.cpu_share`), which says what limited it.
* Kill: a :class:`~firstlight_bench.clients.closed_loop.ClosedLoop` (streamed and non-streamed,
  every answer checked) runs against the region, through plain httpx or the official
  ``openai`` client; one gateway replica's actor is killed
  (``ray.kill``, no graceful stop, as a crashed process or a lost node would be) and the
  load goes on until Ray's replacement answers requests too. Every request that failed
  is counted and classed: in flight at the kill or not. The victim is a gateway the
  region's scrape shows answering, so the kill always hits one that HAProxy sends to.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any, Literal

import httpx

from firstlight_bench.clients.closed_loop import ClosedLoop, HttpxSender, Sender
from firstlight_bench.clients.closed_loop_openai import OpenAISender
from firstlight_bench.reports.serving_report import throughput
from firstlight_bench.tools.cpu_share import cores_used, snapshot

__all__ = ["KILL_CLIENTS", "capacity_block", "kill_one_gateway", "served_by_gateway"]

KillClient = Literal["httpx", "openai"]
KILL_CLIENTS: tuple[KillClient, ...] = ("httpx", "openai")
"""The clients a kill is measured with: plain httpx, which retries nothing, and the
official ``openai`` client with its default retries (what an application would use)."""


_JSON = {"content-type": "application/json"}


def _chat_body(model: str, text: str) -> bytes:
    messages = [{"role": "user", "content": text}]
    body = {"model": model, "messages": messages, "max_tokens": 1, "stream": False}
    return json.dumps(body).encode()


async def _closed_loop(
    client: httpx.AsyncClient, url: str, model: str, concurrency: int, duration_s: float
) -> tuple[list[float], int, float]:
    """Latencies (ms) of the requests that succeeded, the errors, and the elapsed time."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s

    async def worker(w: int) -> None:
        nonlocal errors
        i = 0
        while time.perf_counter() < deadline:
            i += 1
            body = _chat_body(model, f"Say hi {w}-{i}.")
            start = time.perf_counter()
            try:
                ok = (await client.post(url, content=body, headers=_JSON)).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append((time.perf_counter() - start) * 1000)
            else:
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return latencies, errors, time.perf_counter() - start


async def capacity_block(
    url: str, model: str, levels: Sequence[int], duration_s: float, *, gateways: int, block: int
) -> list[dict[str, Any]]:
    """One block of closed-loop levels against ``url`` (a region's chat completions),
    after a short warm-up: a :func:`~firstlight_bench.reports.serving_report.throughput` row per
    level, with ``gateways``, ``block`` and ``cores`` (group → cores used) added."""
    limits = httpx.Limits(max_connections=max(levels), max_keepalive_connections=max(levels))
    rows = []
    async with httpx.AsyncClient(limits=limits, timeout=60.0, trust_env=False) as client:
        await _closed_loop(client, url, model, max(levels), min(2.0, duration_s))
        for concurrency in levels:
            before, t0 = snapshot(), time.perf_counter()
            latencies, errors, elapsed = await _closed_loop(
                client, url, model, concurrency, duration_s
            )
            cores = cores_used(before, snapshot(), time.perf_counter() - t0)
            row = throughput(latencies, elapsed, errors, concurrency)
            rows.append({"gateways": gateways, "block": block, **row, "cores": cores})
    return rows


async def served_by_gateway(
    endpoint: str, headers: dict[str, str] | None = None
) -> dict[str, float]:
    """Requests each live gateway has answered, from one scrape of the region's
    ``/metrics`` (every gateway publishes its counts every 2 s; each sample is labelled
    with its gateway's Ray replica id). ``headers``: an operator key's, where auth is on."""
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
        response = await client.get(f"{endpoint}/metrics", headers=headers)
    response.raise_for_status()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "gen_ai_server_request_duration_seconds_count":
                gateway = sample.labels.get("gateway", "")
                counts[gateway] = counts.get(gateway, 0.0) + sample.value
    return counts


async def _until_serving(
    endpoint: str, load: ClosedLoop, since: dict[str, float], count: int, exclude: set[str]
) -> list[str]:
    """Wait (while ``load`` runs) until ``count`` gateways not in ``exclude`` have answered
    requests since the ``since`` scrape; return them, sorted."""
    async with asyncio.timeout(120):
        while True:
            now = await served_by_gateway(endpoint)
            fresh = sorted(g for g, n in now.items() if n > since.get(g, 0.0) and g not in exclude)
            if len(fresh) >= count:
                return fresh
            await load.wait_for(len(load.answers) + 2)


def _kill(app: str, gateway: str) -> None:
    import ray

    name = f"SERVE_REPLICA::{app}#gateway#{gateway}"
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


async def kill_one_gateway(
    endpoint: str,
    app: str,
    model: str,
    *,
    gateways: int = 2,
    client: KillClient = "httpx",
    clients: int = 4,
    before: int = 60,
    after: int = 120,
    max_tokens: int = 16,
) -> dict[str, Any]:
    """Kill one of ``app``'s ``gateways`` gateways while ``clients`` steady clients of
    kind ``client`` run.

    First ``before`` answers, and every gateway seen answering requests in the region's
    scrape (so the victim is one HAProxy sends to, not one still starting); the kill;
    then ``after`` more answers and until Ray's replacement gateway is seen answering
    too (``replaced_after_s``). Returns the counts (``lost``: every failed request,
    ``lost_in_flight``: those that had started before the kill and not ended) and each
    failure's times relative to the kill. Raises ``TimeoutError`` when the gateways are
    not all answering within two minutes."""
    sender: Sender = OpenAISender(endpoint) if client == "openai" else HttpxSender(endpoint)
    load = ClosedLoop(sender, model, clients=clients, max_tokens=max_tokens)
    since = await served_by_gateway(endpoint)
    load.start()
    try:
        await load.wait_for(before)
        serving = await _until_serving(endpoint, load, since, gateways, set())
        victim = serving[0]
        await asyncio.to_thread(_kill, app, victim)
        killed_at = load.now_s()
        await load.wait_for(len(load.answers) + after)
        await _until_serving(endpoint, load, since, 1, set(serving))
        replaced_at = load.now_s()
        await load.wait_for(len(load.answers) + clients)
    finally:
        answers = await load.stop()
    lost = [a for a in answers if a.lost]
    in_flight = [a for a in lost if a.outcome.arrival_s <= killed_at <= a.ended_s]
    return {
        "client": client,
        "gateways": gateways,
        "clients": clients,
        "max_tokens": max_tokens,
        "requests": len(answers),
        "lost": len(lost),
        "lost_in_flight": len(in_flight),
        "served_after_kill": sum(
            1 for a in answers if a.outcome.arrival_s > killed_at and not a.lost
        ),
        "replaced_after_s": round(replaced_at - killed_at, 1),
        "victim": victim,
        "problems": sorted({a.outcome.error or "" for a in lost}),
        "failures": [
            {
                "started_after_kill_s": round(a.outcome.arrival_s - killed_at, 3),
                "ended_after_kill_s": round(a.ended_s - killed_at, 3),
                "stream": a.stream,
                "problem": a.outcome.error,
            }
            for a in lost
        ],
    }
