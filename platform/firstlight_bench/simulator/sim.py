"""``firstlight bench sim``: every arm on the same trace, across a sweep of offered load,
in the discrete-event simulation — results.json, report.md and plots in one folder.

Called by the CLI (:func:`firstlight.cli.bench_sim`) with the parsed options. For each load
the workload is generated once (its content depends only on the seed, so every load replays
the same prompts with arrivals rescaled) and
:func:`~firstlight_bench.simulator.des.simulate` runs it through each arm, once per seed;
each (seed, load) is one task and tasks run in parallel processes. Loads are fractions of
:func:`measure_capacity_rps`. Every point also carries the trace's ``floor`` reference
(:mod:`firstlight_bench.simulator.floor`).
"""

from __future__ import annotations

import dataclasses
import math
import platform
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from firstlight.engine.sim import SimProfile
from firstlight.errors import ConfigError, ConfigProblem
from firstlight.quantiles import percentile
from firstlight_bench.reports.report import write_run
from firstlight_bench.reports.results import git_commit, summarize
from firstlight_bench.simulator.cluster import (
    ARMS,
    ClusterSpec,
    block_hashes,
    kv_blocks_for,
    parse_fleet,
)
from firstlight_bench.simulator.day import day_metrics
from firstlight_bench.simulator.des import simulate
from firstlight_bench.simulator.floor import floor_ttfts_ms
from firstlight_bench.simulator.warm import warm_metrics
from firstlight_bench.workloads import WORKLOADS, generate

__all__ = ["day_length_s", "default_rtt_ms", "measure_capacity_rps", "operator_params", "run_sim"]

PUBLISHED_RTT_MS: tuple[tuple[float, ...], ...] = (
    (0.0, 72.0, 72.0, 162.0),
    (72.0, 0.0, 129.5, 100.5),
    (72.0, 129.5, 0.0, 226.0),
    (162.0, 100.5, 226.0, 0.0),
)
"""Median round trips between East US (Virginia), West US 2 (Washington), North Europe
(Ireland) and Japan East (Tokyo), milliseconds: Microsoft's "Azure network round-trip
latency statistics" (learn.microsoft.com, azure-network-latency; 30 days ending
2026-07-30, P50 of 1-minute probes over the Azure backbone), the mean of the two
directions of each pair (they differ by at most 2 ms)."""
_NEARBY_MS = 10.0
"""Between two regions mapped onto the same published site (more than four regions)."""


def default_rtt_ms(regions: int) -> tuple[tuple[float, ...], ...]:
    """The RTT matrix of ``regions`` simulated regions: :data:`PUBLISHED_RTT_MS` for up to
    four; beyond, region ``i`` sits at published site ``i mod 4`` and two regions on one
    site are ``_NEARBY_MS`` apart."""
    sites = len(PUBLISHED_RTT_MS)
    return tuple(
        tuple(
            0.0 if a == b else PUBLISHED_RTT_MS[a % sites][b % sites] or _NEARBY_MS
            for b in range(regions)
        )
        for a in range(regions)
    )


def operator_params(profile: SimProfile, mean_output_tokens: float) -> dict[str, dict[str, object]]:
    """The parameters an operator sets from the hardware and the traffic, for the
    policies that take them: ``firstlight``'s cost-model priors (the profile's rates, and
    the trace's mean output, which prices how long a request holds its KV memory) and
    ``llmd_sticky``'s peak prefill throughput (which prices its saturation release)."""
    prefill_rate = 1000.0 / profile.prefill_ms_per_token
    return {
        "firstlight": {
            "prefill_tokens_per_s": prefill_rate,
            "step_overhead_ms": profile.step_overhead_ms,
            "decode_ms_per_running_seq": profile.decode_ms_per_seq,
            "mean_output_tokens": max(round(mean_output_tokens), 1),
        },
        "llmd_sticky": {"peak_prefill_tokens_per_s": prefill_rate},
    }


def region_profiles(cluster: ClusterSpec) -> dict[int, list[SimProfile]]:
    """Each region's replica profiles (the floor takes the fastest for each request)."""
    return {g: cluster.region_profiles(g) for g in range(cluster.regions)}


def measure_capacity_rps(
    workload: str,
    cluster: ClusterSpec,
    memo: dict[tuple[int, ...], tuple[int, ...]],
    *,
    seed: int,
    requests: int,
    regions: int,
    params: Mapping[str, Any],
    ttft_p90_ms: float = 500.0,
    arm: str = "least_queue",
) -> float:
    """The highest offered rate at which ``arm`` keeps the trace's TTFT p90 within
    ``ttft_p90_ms`` (the first SLO) — or within twice the trace's own ``floor`` p90
    where that is longer (long prompts, such as W7's, miss 500 ms with no queue at all)
    — by bisection on the simulator itself: batching, KV limits and chance prefix hits
    included. Load 1.0 is this rate. With the default, cache-blind ``least_queue``,
    routers that reuse prefixes sustain more (the sweep shows how much); W6 measures
    with a prefix-aware arm (``WorkloadSpec.capacity_arm``), whose capacity can be
    several times the cache-blind estimate the bisection starts from, so its range and
    steps grow to match."""
    profile = cluster.build_profile()
    probe = generate(
        workload, seed=seed, rate_rps=1.0, num_requests=requests, regions=regions, **params
    )
    hashes = block_hashes(probe, cluster, memo)
    floors = sorted(floor_ttfts_ms(probe, hashes, region_profiles(cluster)).values())
    floor_p90 = percentile(floors, 0.9) or 0.0
    ttft_p90_ms = max(ttft_p90_ms, 2.0 * floor_p90)
    per_request_ms = probe.mean_prompt_tokens() * profile.prefill_ms_per_token + (
        probe.mean_output_tokens()
        * (profile.decode_ms_per_seq + profile.step_overhead_ms / profile.max_num_seqs)
    )
    analytic = cluster.total_replicas * 1000.0 / per_request_ms
    blind = arm == "least_queue"
    low, high = 0.01 * analytic, (4.0 if blind else 16.0) * analytic
    met = False
    for _ in range(8 if blind else 10):
        rate = math.sqrt(low * high)
        trace = probe.with_rate(rate)
        hashes = block_hashes(trace, cluster, memo)
        run = simulate(trace, arm, cluster, seed=seed, hashes=hashes)
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
                    f"even {low:.3g} req/s misses a TTFT p90 of {ttft_p90_ms:.0f} ms with "
                    f"{arm} on {cluster.profile}: no capacity to sweep a load against",
                    workload,
                    True,
                )
            ]
        )
    return low


@dataclass(frozen=True, slots=True)
class _Task:
    """One (seed, load) of a sweep: its trace through every arm, in one process."""

    workload: str
    seed: int
    load: float
    rate_rps: float
    requests: int
    regions: int
    params: Mapping[str, Any]
    arms: tuple[str, ...]
    cluster: ClusterSpec


def _run_task(task: _Task) -> tuple[list[dict[str, Any]], dict[str, float], list[str]]:
    """The points, wall times and progress lines of one task (runs in a worker)."""
    trace = generate(
        task.workload,
        seed=task.seed,
        rate_rps=task.rate_rps,
        num_requests=task.requests,
        regions=task.regions,
        **task.params,
    )
    cluster = task.cluster
    day_s = day_length_s(task.workload, trace.params)
    hashes = block_hashes(trace, cluster)
    floors = floor_ttfts_ms(trace, hashes, region_profiles(cluster))
    points, wall, lines = [], {}, []
    for arm in task.arms:
        run = simulate(trace, arm, cluster, seed=task.seed, hashes=hashes)
        point = summarize(
            arm,
            task.load,
            run.outcomes,
            imbalance=run.imbalance,
            duration_s=run.duration_s,
            seed=task.seed,
            floor_ttft_ms=list(floors.values()),
        )
        if day_s is not None:
            point["day"] = day_metrics(
                run.outcomes, period_s=day_s, regions=task.regions, events=trace.events
            )
        if cluster.wan_gbps is not None and ARMS[arm].regions == "firstlight":
            point["warm"] = warm_metrics(run.warm)
        points.append(point)
        wall[f"{arm}@{task.load}/seed{task.seed}"] = round(run.wall_s, 2)
        ttft = point["ttft_ms"]
        lines.append(
            f"  seed {task.seed} load {task.load:.2f} {arm:<16} TTFT p50/p90/p99 "
            f"{_ms(ttft['p50'])}/{_ms(ttft['p90'])}/{_ms(ttft['p99'])} ms, "
            f"hit {_pct(point['prefix_hit_rate'])}, {run.wall_s:.1f} s"
        )
    return points, wall, lines


def run_sim(
    *,
    workload: str,
    regions: int,
    replicas: int,
    seeds: Sequence[int],
    arms: Sequence[str],
    loads: Sequence[float],
    out: Path,
    requests: int = 2000,
    profile: str = "h100-llama-8b",
    fleet: str | None = None,
    kv_blocks: int | None = None,
    gateways: int = 1,
    route_share_ms: float | None = 1.0,
    wan_gbps: float | None = None,
    hindsight_share: float = 1.0,
    params: Mapping[str, Any] | None = None,
    command: str | None = None,
    jobs: int = 1,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Path]:
    """Run the sweep and write the folder; returns the written paths. Raises
    ``ConfigError`` for a bad workload parameter, arm, seed list or cluster shape.

    The KV-cache size and the capacity (load 1.0) come from the first seed's trace, so
    every seed runs at the same offered rates; each (seed, load) is one task, run in
    ``jobs`` processes at once (``1``: in this process). ``fleet`` (a
    :func:`~firstlight_bench.simulator.cluster.parse_fleet` text; default: the workload's own, such
    as W8's mixed fleet) replaces ``replicas`` x ``profile`` in every region; ``profile``
    stays the reference for the cost model's priors and the KV sizing. ``gateways``
    routers per region take the requests in turn (``measure_capacity_rps`` sizes load 1.0
    with the cluster's), telling each other their routes ``route_share_ms`` later
    (``None``: not at all). ``wan_gbps`` prices the warm region (KV pulls at that
    bandwidth, ``firstlight`` only) and replays ``hindsight_share`` of the warm requests'
    three ways (:mod:`firstlight_bench.simulator.warm`)."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError([ConfigProblem("seeds", "empty or repeated", list(seeds), True)])
    params = dict(params or {})
    if fleet is None and workload in WORKLOADS:
        fleet = WORKLOADS[workload].fleet
    fleet_spec = parse_fleet(fleet) if fleet else ()
    sim_profile = ClusterSpec(regions, replicas, profile=profile).build_profile()
    first = seeds[0]
    probe = generate(
        workload, seed=first, rate_rps=1.0, num_requests=requests, regions=regions, **params
    )
    priors = operator_params(sim_profile, probe.mean_output_tokens())
    cluster = ClusterSpec(
        regions,
        replicas,
        profile=profile,
        rtt_ms=default_rtt_ms(regions),
        fleet=fleet_spec,
        policy_params=priors,
        gateways=gateways,
        route_share_ms=route_share_ms,
        wan_gbps=wan_gbps,
        hindsight_share=hindsight_share,
    )
    cluster.check("least_queue", probe.regions)
    total = cluster.total_replicas
    memo: dict[tuple[int, ...], tuple[int, ...]] = {}
    hashes = block_hashes(probe, cluster, memo)
    blocks = (
        kv_blocks
        if kv_blocks is not None
        else kv_blocks_for(probe, hashes, total, cluster.build_profile())
    )
    cluster = dataclasses.replace(cluster, kv_cache_blocks=blocks)
    spec = WORKLOADS.get(workload)
    capacity = measure_capacity_rps(
        workload,
        cluster,
        memo,
        seed=first,
        requests=requests,
        regions=regions,
        params={**params, **(spec.capacity_params if spec else {})},
        arm=spec.capacity_arm if spec else "least_queue",
    )
    day_s = day_length_s(workload, probe.params)
    cluster = dataclasses.replace(cluster, replica_capacity_rps=capacity / total)
    del memo, hashes
    shape = f"fleet {fleet}" if fleet else f"{regions} x {replicas} replicas ({profile})"
    sizing = f"{requests} requests" if day_s is None else f"a {day_s:g} s day"
    basis = spec.capacity_arm if spec else "least_queue"
    progress(
        f"{workload}: {sizing}, {shape}, "
        f"{blocks} KV blocks each at most, capacity estimate {capacity:.0f} req/s ({basis}), "
        f"seeds {', '.join(map(str, seeds))}, {jobs} process(es)"
    )
    tasks = [
        _Task(
            workload,
            seed,
            load,
            load * capacity,
            requests if day_s is None else max(round(load * capacity * day_s), 10),
            regions,
            params,
            tuple(arms),
            cluster,
        )
        for seed in seeds
        for load in loads
    ]
    points: list[dict[str, Any]] = []
    wall: dict[str, float] = {}
    for task_points, task_wall, lines in _map(tasks, jobs):
        points += task_points
        wall.update(task_wall)
        for line in lines:
            progress(line)
    meta = {
        "seed": first,
        "seeds": list(seeds),
        "git_commit": git_commit(),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "simulated": True,
        "command": command or "",
        "workload": {"name": workload, "requests": requests, "params": probe.params},
        "config": {
            **asdict(cluster),
            "capacity_rps": capacity,
            "capacity_arm": basis,
            "day_s": day_s,
            "arms": list(arms),
            "loads": list(loads),
        },
        "environment": {"python": sys.version.split()[0], "machine": platform.machine()},
        "wall_s": wall,
    }
    return write_run(out, meta, points)


def day_length_s(workload: str, params: Mapping[str, Any]) -> float | None:
    """The wall-clock day of a workload that has one (``WorkloadSpec.day_param``), in
    seconds, from its resolved parameters; ``None``: a fixed request count."""
    spec = WORKLOADS.get(workload)
    if spec is None or spec.day_param is None:
        return None
    day = params.get(spec.day_param)
    return float(day) if day is not None else None


def _map(
    tasks: Sequence[_Task], jobs: int
) -> Iterator[tuple[list[dict[str, Any]], dict[str, float], list[str]]]:
    """Each task's result as it completes (in this process when ``jobs`` is 1)."""
    if jobs <= 1 or len(tasks) <= 1:
        yield from map(_run_task, tasks)
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
        futures = [pool.submit(_run_task, task) for task in tasks]
        for future in as_completed(futures):
            yield future.result()


def _ms(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
