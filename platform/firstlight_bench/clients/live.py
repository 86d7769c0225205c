"""Live policy comparison: the same trace against a local platform, once per routing arm.

Who calls what: ``firstlight bench run`` (:mod:`firstlight_bench.cli`) calls
:func:`run_live`, which replays one generated workload against gateways that are
already running and writes a one-point run folder. ``firstlight bench live`` calls
:func:`run_live_arms`. For each arm it deploys the config's regions in the local Ray
cluster with ``router.policy`` set to the arm (:func:`firstlight.serve.local_mode.start_local`
— the policy is switched through the platform's configuration, as an operator would),
replays the workload against every region's endpoint
(:func:`firstlight_bench.clients.driver.replay_trace`), deletes the applications, and finally
writes one run folder with a point per arm and seed (rewritten after each seed, so a
run cut short keeps the seeds it finished). Every arm starts from cold replicas (fresh
engines, empty prefix caches) and sees the same trace.

Arms: the platform's policies (only the in-region choice changes: the gateway's region
decision still spills over on the cost model's estimate, unlike the simulator's
region-local baseline arms), :data:`LOCAL_ARM`, and :data:`WATERFALL_ARM`, GKE's capacity
overflow, whose global load balancer the driver plays
(:class:`~firstlight_bench.simulator.region_arms.WaterfallBalancer`) in front of regions that never
spill.

The numbers are measured on the client, in real time, on whatever machine runs them;
with ``sim`` engines they are labelled simulated (``meta.simulated``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from firstlight.config import PlatformConfig
from firstlight.errors import ConfigError, ConfigProblem
from firstlight.routing.registry import policy_names
from firstlight_bench.clients.driver import Steer, replay_trace
from firstlight_bench.reports.report import write_run
from firstlight_bench.reports.results import Outcome, git_commit, summarize
from firstlight_bench.simulator.cluster import ARMS
from firstlight_bench.simulator.day import day_metrics
from firstlight_bench.simulator.region_arms import WaterfallBalancer
from firstlight_bench.simulator.sim import day_length_s
from firstlight_bench.workloads import TraceRequest, Workload, generate

__all__ = [
    "LOCAL_ARM",
    "WATERFALL_ARM",
    "live_arm_names",
    "live_meta",
    "live_point",
    "run_live",
    "run_live_arms",
    "with_policy",
]

_NOT_MEASURED_IMBALANCE = 1.0
"""What :func:`run_live` stores as ``imbalance``: the per-replica load is not visible to a
client, and the results schema needs a finite number (1.0 = perfectly balanced)."""


LOCAL_ARM = "firstlight_local"
"""The region-local arm: ``firstlight`` with ``router.spill_over`` off (requests leave
their region only on fail-over), as the simulator's arm of that name."""


WATERFALL_ARM = "waterfall"
"""GKE's ``WATERFALL_BY_REGION`` in front of the regions, as the simulator's arm of that
name: its in-region policy (``llmd_sticky``) in every region, spill-over off, and the
load driver as the global load balancer."""


def live_arm_names() -> tuple[str, ...]:
    """What ``firstlight bench live --arms`` accepts: the platform's policies,
    :data:`LOCAL_ARM` and :data:`WATERFALL_ARM`."""
    return (*policy_names(), LOCAL_ARM, WATERFALL_ARM)


def with_policy(config: PlatformConfig, arm: str) -> PlatformConfig:
    """``config`` routing with ``arm``; its ``router.params`` are kept only for the
    policy they were written for (a baseline takes none of firstlight's)."""
    router = config.router
    if arm == LOCAL_ARM:
        policy = "firstlight"
    elif arm == WATERFALL_ARM:
        policy = ARMS[WATERFALL_ARM].policy
    else:
        policy = arm
    params = router.params if policy == router.policy else {}
    update: dict[str, Any] = {"policy": policy, "params": params}
    if arm in (LOCAL_ARM, WATERFALL_ARM):
        update["spill_over"] = False
    return config.model_copy(update={"router": router.model_copy(update=update)})


def _waterfall(config: PlatformConfig, replica_capacity_rps: float) -> WaterfallBalancer:
    """The global load balancer of :data:`WATERFALL_ARM` over ``config``'s regions: their
    configured peer round trips, the first model's replicas in each."""
    names = [r.name for r in config.regions]
    rtt = [[0.0] * len(names) for _ in names]
    for a, region in enumerate(config.regions):
        for peer in region.peers:
            if peer.region in names:
                rtt[a][names.index(peer.region)] = peer.rtt_ms
    replicas = [config.models[0].replicas] * len(names)
    return WaterfallBalancer(rtt, replicas, replica_capacity_rps)


def _steer(balancer: WaterfallBalancer) -> Steer:
    """The driver's ``steer`` for ``balancer`` (a fresh one per replay: its rate windows
    start empty, as every arm's replicas start cold)."""

    def steer(request: TraceRequest, now_s: float) -> tuple[int, float]:
        return balancer.choose(request.client_region, now_s)

    return steer


def run_live_arms(
    *,
    config: PlatformConfig,
    arms: Sequence[str],
    workload: str,
    seeds: Sequence[int],
    rate_rps: float,
    requests: int,
    out: Path,
    params: Mapping[str, Any] | None = None,
    command: str | None = None,
    max_concurrency: int = 256,
    timeout_s: float = 120.0,
    startup_timeout_s: float = 900.0,
    replica_capacity_rps: float | None = None,
    report: Callable[[str], None] = lambda _line: None,
) -> dict[str, Path]:
    """Run each seed's trace once per arm against a freshly deployed local platform and
    write the run folder; returns the written paths.

    The model is the config's first. A workload with a wall-clock day (W6) gets the day
    block in each point (:func:`~firstlight_bench.simulator.day.day_metrics`).
    ``replica_capacity_rps`` is :data:`WATERFALL_ARM`'s ``maxRatePerEndpoint``. Raises
    ``ConfigError`` for an arm :func:`live_arm_names` does not list, the waterfall without
    a capacity, no seeds, a bad workload,
    and whatever :func:`~firstlight.serve.local_mode.start_local` raises when the platform
    does not come up (the applications of that arm are deleted first).
    """
    from firstlight.serve.local_mode import start_local, stop_local

    allowed = live_arm_names()
    unknown = [a for a in arms if a not in allowed]
    if not arms or unknown:
        raise ConfigError(
            [
                ConfigProblem(
                    "arms",
                    f"{', '.join(unknown) or 'none given'}: live arms are {', '.join(allowed)}",
                    list(arms),
                    True,
                )
            ]
        )
    if WATERFALL_ARM in arms and replica_capacity_rps is None:
        raise ConfigError(
            [
                ConfigProblem(
                    "replica_capacity_rps",
                    f"the {WATERFALL_ARM} arm needs each replica's capacity in req/s "
                    "(GKE's maxRatePerEndpoint)",
                    None,
                    True,
                )
            ]
        )
    if not seeds:
        raise ConfigError([ConfigProblem("seeds", "at least one seed is needed", [], True)])
    model = config.models[0].name
    points: list[dict[str, Any]] = []
    simulated = False
    walls: dict[str, float] = {}
    targets: list[str] = []
    written: dict[str, Path] = {}
    for seed in seeds:
        trace = generate(
            workload,
            seed=seed,
            rate_rps=rate_rps,
            num_requests=requests,
            regions=len(config.regions),
            **dict(params or {}),
        )
        for arm in arms:
            steer: Steer | None = None
            if arm == WATERFALL_ARM:
                assert replica_capacity_rps is not None
                steer = _steer(_waterfall(config, replica_capacity_rps))
            report(f"seed {seed} {arm}: deploying {len(config.regions)} region(s)")
            running = start_local(
                with_policy(config, arm), report=report, timeout_s=startup_timeout_s
            )
            try:
                targets = [running.endpoints[r.name] for r in config.regions]
                report(f"seed {seed} {arm}: replaying {requests} requests at {rate_rps:g} req/s")
                started = time.monotonic()
                outcomes, arm_simulated = replay_trace(
                    trace,
                    targets,
                    model=model,
                    max_concurrency=max_concurrency,
                    timeout_s=timeout_s,
                    steer=steer,
                )
                walls[f"{arm}/seed{seed}"] = round(time.monotonic() - started, 2)
            finally:
                stop_local(running)
            simulated = simulated or arm_simulated
            point = live_point(arm, rate_rps, outcomes, seed=seed)
            day_s = day_length_s(workload, trace.params)
            if day_s is not None:
                point["day"] = day_metrics(
                    outcomes, period_s=day_s, regions=len(config.regions), events=trace.events
                )
            points.append(point)
            ttft = point["ttft_ms"]
            report(
                f"seed {seed} {arm}: {point['completed']} completed, {point['errors']} errors, "
                f"TTFT p50/p90 {ttft['p50']}/{ttft['p90']} ms"
            )
        meta = live_meta(
            trace,
            seed=seeds[0],
            simulated=simulated,
            command=command,
            config={
                "targets": targets,
                "model": model,
                "arms": list(arms),
                "seeds": list(seeds),
                "engines": sorted({m.engine for m in config.models}),
                "replicas_per_region": {m.name: m.replicas for m in config.models},
                "platform": config.model_dump(mode="json", include={"regions", "models", "router"}),
                "max_concurrency": max_concurrency,
                "timeout_s": timeout_s,
                "replica_capacity_rps": replica_capacity_rps,
                "replay_wall_s": walls,
            },
            wall_s=sum(walls.values()),
        )
        written = write_run(out, meta, points)
    return written


def run_live(
    *,
    targets: Sequence[str],
    workload: str,
    seed: int,
    rate_rps: float,
    requests: int,
    model: str,
    out: Path,
    label: str = "firstlight",
    params: Mapping[str, Any] | None = None,
    command: str | None = None,
    max_concurrency: int = 256,
    timeout_s: float = 120.0,
) -> dict[str, Path]:
    """Generate ``workload`` (one client region per target), replay it at ``rate_rps``
    against ``targets`` and write the run folder ``out``; returns the written paths.

    Called by ``firstlight bench run``. The single point has arm ``label`` and load
    ``rate_rps`` (requests per second, not a fraction of capacity). ``imbalance`` is not
    measured from the client (it needs per-replica queue lengths): the point stores 1.0.
    ``meta.simulated`` is True when any response carried ``x-firstlight-simulated: true``.
    Raises ``ConfigError`` for a bad workload, parameter, rate or request count and
    ``ValueError`` for no targets.
    """
    if not targets:
        raise ValueError("targets: at least one region endpoint is needed")
    trace = generate(
        workload,
        seed=seed,
        rate_rps=rate_rps,
        num_requests=requests,
        regions=len(targets),
        **dict(params or {}),
    )
    started = time.monotonic()
    outcomes, simulated = replay_trace(
        trace, targets, model=model, max_concurrency=max_concurrency, timeout_s=timeout_s
    )
    wall = time.monotonic() - started
    meta = live_meta(
        trace,
        seed=seed,
        simulated=simulated,
        command=command,
        config={
            "targets": list(targets),
            "model": model,
            "label": label,
            "max_concurrency": max_concurrency,
            "timeout_s": timeout_s,
        },
        wall_s=wall,
    )
    return write_run(out, meta, [live_point(label, rate_rps, outcomes)])


def live_point(
    label: str, rate_rps: float, outcomes: Sequence[Outcome], *, seed: int | None = None
) -> dict[str, Any]:
    """One result point of a live replay: arm ``label`` at load ``rate_rps`` (req/s), of
    the trace of ``seed`` when the run has several."""
    ends = [o.finish_s for o in outcomes if o.finish_s is not None]
    span = max([*ends, *(o.arrival_s for o in outcomes)], default=0.0)
    return summarize(
        label,
        rate_rps,
        list(outcomes),
        imbalance=_NOT_MEASURED_IMBALANCE,
        duration_s=span if span > 0 else None,
        seed=seed,
    )


def live_meta(
    trace: Workload,
    *,
    seed: int,
    simulated: bool,
    command: str | None,
    config: Mapping[str, Any],
    wall_s: float,
) -> dict[str, Any]:
    """The ``meta`` of a live run's ``results.json``."""
    return {
        "seed": seed,
        "git_commit": git_commit(),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "simulated": simulated,
        "command": command or "",
        "workload": {
            "name": trace.name,
            "requests": len(trace.requests),
            "rate_rps": float(trace.rate_rps),
            "params": trace.params,
        },
        "config": {**config, "imbalance": "not measured from the client; stored as 1.0"},
        "environment": {"python": sys.version.split()[0]},
        "wall_s": round(wall_s, 2),
    }
