"""``firstlight bench sim``: every arm on the same trace, across a sweep of offered load,
in the discrete-event simulation — results.json, report.md and plots in one folder.

Called by the CLI (:func:`firstlight.cli.bench_sim`) with the parsed options. For each
load the workload is generated once (its content depends only on the seed, so every load
replays the same prompts with arrivals rescaled) and :func:`~firstlight_bench.des.simulate`
runs it through each arm. Loads are fractions of :func:`measure_capacity_rps`.
"""

from __future__ import annotations

import math
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from firstlight.errors import ConfigError, ConfigProblem
from firstlight.telemetry.rolling import percentile
from firstlight_bench.des import ClusterSpec, block_hashes, kv_blocks_for, simulate
from firstlight_bench.report import write_run
from firstlight_bench.results import git_commit, summarize
from firstlight_bench.workloads import generate

__all__ = ["default_rtt_ms", "measure_capacity_rps", "run_sim"]

_DEFAULT_RTTS_MS = (0.0, 80.0, 217.0, 150.0)
"""Round trips from region 0 (BENCHMARKS.md's 0 / 80 / 217 ms, and a fourth)."""


def default_rtt_ms(regions: int) -> tuple[tuple[float, ...], ...]:
    """A symmetric RTT matrix: region 0 to region i as in BENCHMARKS.md, and between two
    other regions the larger of their distances to region 0."""
    base = [_DEFAULT_RTTS_MS[i % len(_DEFAULT_RTTS_MS)] for i in range(regions)]
    return tuple(
        tuple(0.0 if a == b else base[b] if a == 0 else base[a] if b == 0
              else max(base[a], base[b]) for b in range(regions))
        for a in range(regions)
    )  # fmt: skip


def measure_capacity_rps(
    workload: str,
    cluster: ClusterSpec,
    hashes: Mapping[str, tuple[int, ...]],
    *,
    seed: int,
    requests: int,
    regions: int,
    params: Mapping[str, Any],
    ttft_p90_ms: float = 500.0,
    iterations: int = 8,
) -> float:
    """The highest offered rate at which a cache-blind router (``least_queue``) keeps
    the trace's TTFT p90 within ``ttft_p90_ms`` (the first SLO), by bisection on the
    simulator itself — batching, KV limits and chance prefix hits included. Load 1.0 is
    this rate; routers that reuse prefixes sustain more (the sweep shows how much)."""
    profile = cluster.build_profile()
    probe = generate(
        workload, seed=seed, rate_rps=1.0, num_requests=requests, regions=regions, **params
    )
    per_request_ms = probe.mean_prompt_tokens() * profile.prefill_ms_per_token + (
        probe.mean_output_tokens()
        * (profile.decode_ms_per_seq + profile.step_overhead_ms / profile.max_num_seqs)
    )
    analytic = cluster.regions * cluster.replicas_per_region * 1000.0 / per_request_ms
    low, high = 0.01 * analytic, 4.0 * analytic
    met = False
    for _ in range(iterations):
        rate = math.sqrt(low * high)
        trace = probe.with_rate(rate)
        run = simulate(trace, "least_queue", cluster, seed=seed, hashes=hashes)
        ttfts = sorted(o.ttft_ms for o in run.outcomes if o.ttft_ms is not None)
        p90 = percentile(ttfts, 0.9)
        if p90 is not None and p90 <= ttft_p90_ms:
            low, met = rate, True
        else:
            high = rate
    if not met:
        raise ConfigError(
            [
                ConfigProblem(
                    "workload",
                    f"even {low:.3g} req/s misses a TTFT p90 of {ttft_p90_ms:.0f} ms on "
                    f"{cluster.profile}: no capacity to sweep a load against",
                    workload,
                    True,
                )
            ]
        )
    return low


def run_sim(
    *,
    workload: str,
    regions: int,
    replicas: int,
    seed: int,
    arms: Sequence[str],
    loads: Sequence[float],
    out: Path,
    requests: int = 2000,
    profile: str = "h100-llama-8b",
    kv_blocks: int | None = None,
    params: Mapping[str, Any] | None = None,
    command: str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Path]:
    """Run the sweep and write the folder; returns the written paths. Raises
    ``ConfigError`` for a bad workload parameter, arm or cluster shape."""
    params = dict(params or {})
    total = regions * replicas
    sim_profile = ClusterSpec(regions, replicas, profile=profile).build_profile()
    # An operator configures the cost model's priors for the hardware; so does the sweep.
    priors: dict[str, object] = {
        "prefill_tokens_per_s": 1000.0 / sim_profile.prefill_ms_per_token,
        "step_overhead_ms": sim_profile.step_overhead_ms,
        "decode_ms_per_running_seq": sim_profile.decode_ms_per_seq,
    }
    probe = generate(
        workload, seed=seed, rate_rps=1.0, num_requests=requests, regions=regions, **params
    )
    cluster = ClusterSpec(
        regions, replicas, profile=profile, rtt_ms=default_rtt_ms(regions), policy_params=priors
    )
    hashes = block_hashes(probe, cluster)
    blocks = (
        kv_blocks
        if kv_blocks is not None
        else kv_blocks_for(probe, hashes, total, cluster.build_profile())
    )
    cluster = ClusterSpec(
        regions,
        replicas,
        profile=profile,
        kv_cache_blocks=blocks,
        rtt_ms=cluster.rtt_ms,
        policy_params=priors,
    )
    capacity = measure_capacity_rps(
        workload, cluster, hashes, seed=seed, requests=requests, regions=regions, params=params
    )
    progress(
        f"{workload}: {requests} requests, {regions} x {replicas} replicas ({profile}, "
        f"{blocks} KV blocks each), capacity estimate {capacity:.0f} req/s"
    )
    points = []
    wall = {}
    for load in loads:
        trace = generate(
            workload,
            seed=seed,
            rate_rps=load * capacity,
            num_requests=requests,
            regions=regions,
            **params,
        )
        for arm in arms:
            run = simulate(trace, arm, cluster, seed=seed, hashes=hashes)
            point = summarize(
                arm, load, run.outcomes, imbalance=run.imbalance, duration_s=run.duration_s
            )
            points.append(point)
            wall[f"{arm}@{load}"] = round(run.wall_s, 2)
            ttft = point["ttft_ms"]
            progress(
                f"  load {load:.2f} {arm:<16} TTFT p50/p90/p99 "
                f"{_ms(ttft['p50'])}/{_ms(ttft['p90'])}/{_ms(ttft['p99'])} ms, "
                f"hit {_pct(point['prefix_hit_rate'])}, {run.wall_s:.1f} s"
            )
    meta = {
        "seed": seed,
        "git_commit": git_commit(),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "simulated": True,
        "command": command or "",
        "workload": {"name": workload, "requests": requests, "params": probe.params},
        "config": {
            **asdict(cluster),
            "capacity_rps": capacity,
            "arms": list(arms),
            "loads": list(loads),
        },
        "environment": {"python": sys.version.split()[0], "machine": platform.machine()},
        "wall_s": wall,
    }
    return write_run(out, meta, points)


def _ms(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
