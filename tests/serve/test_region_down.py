"""A region's model application goes down under steady load (every replica of its model
killed at once, as when its GPU nodes are lost; Ray Serve then starts new ones): the
region's gateway fails its requests over to the peer region, then serves them itself
again once its replicas are back. Every answer is checked (status, text, usage, [DONE]):
0 lost, 0 hung. Time to detect and time to recover are reported. Real local Ray
cluster, two emulated regions, ``sim`` engines."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from firstlight_bench.clients.closed_loop import Answer, ClosedLoop, HttpxSender
from tests.serve.cluster import API_KEY, platform_config, sim_model

MODEL = "sim-region-down"
EAST, WEST = "down-east", "down-west"


@pytest.fixture(scope="module")
def regions(serve_port: int, key_file: Path) -> Iterator[LocalPlatform]:
    config = platform_config(
        serve_port,
        [
            {"name": EAST, "peers": [{"region": WEST, "rtt_ms": 20}]},
            {"name": WEST, "peers": [{"region": EAST, "rtt_ms": 20}]},
        ],
        [sim_model(MODEL, replicas=2)],
        key_file=key_file,
        # No spill-over while both regions are up: every request leaving east is a fail-over.
        extra={"router": {"spill_over_margin_ms": 60_000}},
    )
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


def _kill_every_replica(app: str) -> int:
    import ray

    prefix = f"SERVE_REPLICA::{app}#model-{MODEL}#"
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(prefix)
    ]
    for name in names:
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    return len(names)


@pytest.mark.slow
async def test_a_region_whose_replicas_all_die_fails_over_and_loses_nothing(
    regions: LocalPlatform, record_property: Callable[[str, object], None]
) -> None:
    sender = HttpxSender(regions.endpoints[EAST], api_key=API_KEY)
    load = ClosedLoop(sender, MODEL, clients=4, max_tokens=16)
    load.start()
    await load.wait_for(12)
    assert all(a.route == "local" for a in load.answers), "both regions up: all served here"
    killed = await asyncio.to_thread(_kill_every_replica, EAST)
    assert killed == 2
    killed_at = load.now_s()
    # Until east serves locally again, well after its new replicas came up.
    try:
        async with asyncio.timeout(120):
            while not _back(load.answers, killed_at):
                await load.wait_for(len(load.answers) + 1)
    except TimeoutError:
        await load.stop()
        async with httpx.AsyncClient(timeout=10) as client:
            readyz = (await client.get(f"{regions.endpoints[EAST]}/readyz")).text
        diagnosis = await asyncio.to_thread(_diagnosis, load.answers, killed_at)
        pytest.fail(f"{EAST} never served locally again: {diagnosis}; gateway /readyz {readyz}")
    await load.wait_for(len(load.answers) + 8)
    answers = await load.stop()

    lost = [a for a in answers if a.lost]
    assert lost == [], collections.Counter(a.outcome.error for a in lost)
    after = [a for a in answers if a.outcome.arrival_s >= killed_at]
    failed_over = [a for a in after if a.route == "fail_over"]
    assert failed_over, collections.Counter(a.route for a in after)
    assert {a.region for a in failed_over} == {WEST}
    detect_s = min(_first_seen(a) for a in failed_over) - killed_at
    recovered_s = _back(answers, killed_at)
    assert recovered_s is not None
    in_flight = [a for a in answers if a.outcome.arrival_s < killed_at < a.ended_s]
    figures = {
        "requests": len(answers),
        "lost": len(lost),
        "in_flight": len(in_flight),
        "failed_over": len(failed_over),
        "detect_s": detect_s,
        "recovered_s": recovered_s,
    }
    for name, value in figures.items():
        record_property(name, value)  # firstlight bench faults stores them
    print(
        f"\nregion {EAST}: every replica killed under load ({load.clients} clients): "
        f"{len(answers)} requests, 0 lost, 0 hung; {len(failed_over)} failed over to {WEST}; "
        f"{len(in_flight)} were in flight at the kill; first fail-over answered "
        f"{detect_s:.2f} s after the kill; served locally again after {recovered_s:.1f} s; "
        f"routes after the kill: {dict(collections.Counter(a.route for a in after))}"
    )


def _diagnosis(answers: list[Answer], killed_at: float) -> str:
    """What Ray says of east's model deployment and how the requests went since the kill
    (the failure message when recovery never comes)."""
    from ray import serve

    status = serve.status().applications[EAST].deployments[f"model-{MODEL}"]
    routes = collections.Counter(a.route for a in answers if a.outcome.arrival_s >= killed_at)
    recent = [(round(a.outcome.arrival_s - killed_at, 1), a.route) for a in answers[-6:]]
    return (
        f"deployment {status.status.value} {dict(status.replica_states)} "
        f"({status.message!r}); routes since the kill {dict(routes)}; "
        f"last answers (s after the kill, route) {recent}"
    )


def _first_seen(answer: Answer) -> float:
    """When its first token came (its whole body, not streamed), or it was sent."""
    first = answer.outcome.first_token_s
    return answer.outcome.arrival_s if first is None else first


def _back(answers: list[Answer], killed_at: float) -> float | None:
    """Seconds from the kill until the first request that was served locally again after
    the region failed over: started after the first fail-over that itself started after
    the kill (a request already in flight at the kill can fail over too, and requests
    routed just before the kill can still be served here); ``None`` while there is
    none."""
    sent = [(a.outcome.arrival_s, a.route) for a in answers]
    failed_over = [at for at, route in sent if route == "fail_over" and at >= killed_at]
    if not failed_over:
        return None
    first = min(failed_over)
    local = [at for at, route in sent if route == "local" and at > first]
    return min(local) - killed_at if local else None
