"""Decision-time micro-benchmark of the routing policies, and hint-mirror memory.

Run ``python -m firstlight_bench.decision`` (options: ``--replicas 8,64,256 --blocks 256
--requests 2000 --seed 0 --policies firstlight,least_queue``). Prints JSON:
``decision_us[replicas][policy] = {p50, p99}`` — the time of ``choose`` plus
``on_routed`` (what the request router runs per request, hint lookup included) — and
``mirror_bytes_per_million_entries``. Numbers depend on the machine: compare arms
measured in the same run.

Workload: 32 shared prefixes of ``blocks * 3/4`` blocks (system prompts), each held by
3 replicas in the hint mirror, plus ``blocks / 4`` blocks unique to each request; every
replica also holds 2,000 unrelated blocks, so lookups walk a realistically full mirror.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

from firstlight.hints import BlockEvent, HintMirror
from firstlight.routing import ReplicaView, RequestView, RoutingInput, build_policy, policy_names
from firstlight.telemetry.rolling import percentile

__all__ = ["main", "measure_decisions", "measure_mirror_memory"]

_BLOCK_SIZE = 32
_PREFIXES = 32
_HOLDERS_PER_PREFIX = 3
_UNRELATED_BLOCKS_PER_REPLICA = 2000


def _fixed_clock() -> float:
    return 0.0


def _build_cluster(
    replicas: int, blocks: int, rng: random.Random
) -> tuple[HintMirror, list[ReplicaView], list[tuple[int, ...]]]:
    mirror = HintMirror(ttl_s=1e9, clock=_fixed_clock)
    shared_len = blocks * 3 // 4
    prefixes = [tuple(rng.getrandbits(64) for _ in range(shared_len)) for _ in range(_PREFIXES)]
    ids = [f"region-{i % 4}/replica-{i}" for i in range(replicas)]
    for prefix in prefixes:
        for replica_id in rng.sample(ids, min(_HOLDERS_PER_PREFIX, replicas)):
            mirror.apply(BlockEvent(replica_id, 0, prefix, ()))
    for replica_id in ids:
        unrelated = tuple(rng.getrandbits(64) for _ in range(_UNRELATED_BLOCKS_PER_REPLICA))
        mirror.apply(BlockEvent(replica_id, 0, unrelated, ()))
    views = [
        ReplicaView(
            replica_id=replica_id,
            region=replica_id.split("/")[0],
            queue_len=(queued := rng.randint(0, 16)),
            running=min(queued, 8),
            pending_prefill_tokens=max(queued - 8, 0) * 400,
            kv_cache_usage=rng.random(),
        )
        for replica_id in ids
    ]
    return mirror, views, prefixes


def measure_decisions(
    replicas: int, blocks: int, requests: int, seed: int, policies: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Decision time percentiles (µs) of each policy on one shared cluster and trace."""
    rng = random.Random(seed)
    mirror, views, prefixes = _build_cluster(replicas, blocks, rng)
    unique_len = blocks - len(prefixes[0])
    trace = [
        RequestView(
            request_id=f"q{i}",
            prompt_tokens=blocks * _BLOCK_SIZE,
            block_hashes=rng.choice(prefixes)
            + tuple(rng.getrandbits(64) for _ in range(unique_len)),
            block_size=_BLOCK_SIZE,
        )
        for i in range(requests)
    ]
    rtt_ms = {f"region-{i}": 40.0 * i for i in range(4)}
    results: dict[str, dict[str, float]] = {}
    for name in policies:
        policy = build_policy(name, {}, rng=random.Random(seed), clock=_fixed_clock)
        samples_ns: list[int] = []
        for request in trace:
            routing = RoutingInput(request, views, mirror, rtt_ms)
            start = time.perf_counter_ns()
            decision = policy.choose(routing)
            policy.on_routed(request, decision.winner)
            samples_ns.append(time.perf_counter_ns() - start)
            policy.on_done(request, decision.winner)
        ordered = sorted(samples_ns)
        p50, p99 = (percentile(ordered, q) or 0.0 for q in (0.5, 0.99))
        results[name] = {"p50": round(p50 / 1000, 1), "p99": round(p99 / 1000, 1)}
    return results


def measure_mirror_memory(entries: int = 1_000_000, replicas: int = 64, seed: int = 0) -> int:
    """Bytes the hint mirror allocates per million (replica, block) entries."""
    rng = random.Random(seed)
    per_replica = entries // replicas
    batches = [tuple(rng.getrandbits(64) for _ in range(per_replica)) for _ in range(replicas)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        mirror = HintMirror(ttl_s=1e9, clock=_fixed_clock)
        for i, batch in enumerate(batches):
            mirror.apply(BlockEvent(f"replica-{i}", 0, batch, ()))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return round(used * 1_000_000 / len(mirror))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse options, run the measurements, print and return the JSON report."""
    parser = argparse.ArgumentParser(prog="python -m firstlight_bench.decision")
    parser.add_argument("--replicas", default="8,64,256", help="comma-separated counts")
    parser.add_argument("--blocks", type=int, default=256, help="blocks per prompt")
    parser.add_argument("--requests", type=int, default=2000, help="decisions per point")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default=",".join(policy_names()))
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    report: dict[str, Any] = {
        "meta": {
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "blocks_per_prompt": args.blocks,
            "block_size": _BLOCK_SIZE,
            "requests_per_point": args.requests,
            "seed": args.seed,
        },
        "decision_us": {
            str(n): measure_decisions(n, args.blocks, args.requests, args.seed, policies)
            for n in (int(x) for x in args.replicas.split(","))
        },
        "mirror_bytes_per_million_entries": measure_mirror_memory(seed=args.seed),
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
