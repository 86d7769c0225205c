"""Several gateways per region (``gateway.replicas: 2``, the default): the ingress spreads
requests over both, a scrape of either shows both (each sample labelled ``gateway``), the
built-in dashboard merges both gateways' windows, and
killing one under steady load loses only the requests that were inside it — the region's
endpoint stays up, and the dead gateway leaves the scrape. Real local Ray cluster,
HAProxy ingress, ``sim`` engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from firstlight.telemetry.gateways import LIVE_FOR_S
from firstlight_bench.clients.closed_loop import Answer, ClosedLoop, HttpxSender
from firstlight_bench.tools.serving_gateways import served_by_gateway
from tests.serve.cluster import API_KEY, platform_config, sim_model

OPERATOR = {"authorization": f"Bearer {API_KEY}"}
"""The test key is also the platform's operator key (tests.serve.cluster): /metrics."""

MODEL = "sim-gateways"
REGION = "gw-east"


@pytest.fixture(scope="module")
def region(serve_port: int, key_file: Path) -> Iterator[LocalPlatform]:
    config = platform_config(
        serve_port,
        [{"name": REGION}],
        [sim_model(MODEL, replicas=1)],
        key_file=key_file,
        extra={"gateway": {"replicas": 2}},
    )
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


async def _dashboard(endpoint: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{endpoint}/dashboard/api/state", headers=OPERATOR)
    response.raise_for_status()
    state: dict[str, Any] = response.json()
    return state


HAPROXY_UPDATE_S = 1.0
"""Ray broadcasts a replica's death to its HAProxy manager, which coalesces updates for
0.1 s and reloads HAProxy: within this, new requests may still go to the dead gateway."""


def _kill(app: str, replica_id: str) -> None:
    import ray

    name = f"SERVE_REPLICA::{app}#gateway#{replica_id}"
    actor = ray.get_actor(name, namespace="serve")
    ray.kill(actor, no_restart=True)  # returns before the process is gone
    # A call on the killed actor fails once Ray knows it is dead.
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.__ray_ready__.remote(), timeout=60)


@pytest.mark.slow
async def test_two_gateways_share_the_region_and_losing_one_loses_only_its_requests(
    region: LocalPlatform,
) -> None:
    endpoint = region.endpoints[REGION]
    load = ClosedLoop(HttpxSender(endpoint, api_key=API_KEY), MODEL, clients=4, max_tokens=16)
    load.start()
    await load.wait_for(40)
    # Gateways publish every 2 s: poll until the scrape shows both with their requests.
    async with asyncio.timeout(30):
        while (
            len(counts := await served_by_gateway(endpoint, OPERATOR)) < 2
            or min(counts.values()) == 0
        ):
            await load.wait_for(len(load.answers) + 4)
    assert len(counts) == 2, counts
    # The built-in dashboard merges both gateways' windows, whichever one answers the
    # poll: the first poll marks it watched, the others publish within 2 s.
    async with asyncio.timeout(30):
        while len((state := await _dashboard(endpoint))["gateways"]) < 2:
            await load.wait_for(len(load.answers) + 4)
    assert set(state["gateways"]) == set(counts)
    assert state["models"][0]["ttft_ms"]["count"] > 0
    victim = min(counts)

    killing_at = load.now_s()
    await asyncio.to_thread(_kill, REGION, victim)
    killed_at = load.now_s()  # Ray has confirmed the gateway dead
    await load.wait_for(len(load.answers) + 40)
    # The dead gateway stops publishing and leaves the scrape (Ray starts a new one).
    async with asyncio.timeout(4 * LIVE_FOR_S):
        while victim in await served_by_gateway(endpoint, OPERATOR):
            await load.wait_for(len(load.answers) + 1)
    answers = await load.stop()

    def inside_at_kill(answer: Answer) -> bool:
        """In flight at some moment between the kill and Ray's confirmation of it, or
        sent while Ray's HAProxy still lists the dead gateway (it is told of the death
        and reloads within ``HAPROXY_UPDATE_S``): such a request can reach the client
        as a connection closed without a response, which the ingress cannot retry
        (docs/serving.md, "Several gateways"; the official client retries it)."""
        sent_s = answer.outcome.arrival_s
        return sent_s <= killed_at + HAPROXY_UPDATE_S and killing_at <= answer.ended_s

    lost = [a for a in answers if a.lost]
    assert [a for a in lost if not inside_at_kill(a)] == [], [
        (round(a.outcome.arrival_s - killed_at, 2), a.outcome.error) for a in lost
    ]
    assert len(lost) <= 2 * load.clients, lost  # one in flight and one sent, per client
    served_after = [a for a in answers if a.outcome.arrival_s > killed_at and not a.lost]
    assert len(served_after) >= 40
    print(
        f"\n{REGION}: 2 gateways, one killed under load ({load.clients} clients): "
        f"{len(answers)} requests, {len(lost)} lost (in flight at the kill or sent before "
        f"the ingress dropped the dead gateway), "
        f"{len(served_after)} served after it; per-gateway before the kill {counts}"
    )
