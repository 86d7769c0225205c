"""The ``floor`` reference: each request's TTFT if routing could not do better.

Not a routing policy: a lower bound every arm is reported against (BENCHMARKS.md). A
request's floor is its TTFT **alone on an idle replica of its own region** (no queue, no
round trip; :meth:`~firstlight.engine.sim.SimProfile.lone_ttft_ms` on the region's
fastest replica for that request), **with every prompt block that any earlier request of that region
brought already cached** — once that request's own floor prefill would have finished.

Two choices make it arm-independent, so one floor serves every arm of a trace:

* the cache is the region's union with no eviction, where the issue's wording ("every
  block any replica of that region holds at its arrival") would depend on what an arm's
  routing left in the caches; the union of everything seen is at least as warm, so this
  floor is at most that one (a stricter reference);
* prompt blocks only: the simulator does not cache generated tokens (their ids are
  filler, not the workload's answers), so no arm could hit them either.

Called by :func:`firstlight_bench.simulator.sim.run_sim` once per trace; pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from firstlight.engine.sim import SimProfile
from firstlight_bench.workloads import Workload

__all__ = ["floor_ttfts_ms"]


def floor_ttfts_ms(
    workload: Workload,
    hashes: Mapping[str, tuple[int, ...]],
    profiles: Mapping[int, Sequence[SimProfile]],
) -> dict[str, float]:
    """Request id → floor TTFT in ms. ``hashes`` are the requests' hint hashes
    (:func:`firstlight_bench.simulator.cluster.block_hashes`); ``profiles`` maps each client region
    to its replicas' profiles (a block size common to them). Raises ``KeyError`` for a
    request whose region has no profile."""
    ready: dict[int, dict[int, float]] = {}
    """Per region: block hash → when it is first cached (trace seconds)."""
    floors = {}
    for request in sorted(workload.requests, key=lambda r: r.arrival_s):
        region = request.client_region
        kinds = profiles[region]
        block_size = kinds[0].block_size
        known = ready.setdefault(region, {})
        blocks = hashes[request.request_id]
        cached = 0
        for block in blocks:
            if known.get(block, math.inf) > request.arrival_s:
                break
            cached += 1
        ttft_ms = min(p.lone_ttft_ms(len(request.prompt), cached * block_size) for p in kinds)
        done_s = request.arrival_s + ttft_ms / 1000.0
        for block in blocks[cached:]:
            if known.get(block, math.inf) > done_s:
                known[block] = done_s
        floors[request.request_id] = ttft_ms
    return floors
