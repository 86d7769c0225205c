"""Live policy comparison: the same trace against a local platform, once per routing arm.

Who calls what: ``firstlight bench live`` (:mod:`firstlight_bench.cli`) calls
:func:`run_live_arms`. For each arm it deploys the config's regions in the local Ray
cluster with ``router.policy`` set to the arm (:func:`firstlight.serve.local_mode.start_local`
— the policy is switched through the platform's configuration, as an operator would),
replays the workload against every region's endpoint
(:func:`firstlight_bench.driver.replay_trace`), deletes the applications, and finally
writes one run folder with a point per arm. Every arm starts from cold replicas (fresh
engines, empty prefix caches) and sees the same trace.

The numbers are measured on the client, in real time, on whatever machine runs them;
with ``sim`` engines they are labelled simulated (``meta.simulated``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from firstlight.config import PlatformConfig
from firstlight.errors import ConfigError, ConfigProblem
from firstlight.routing.registry import policy_names
from firstlight_bench.driver import live_meta, live_point, replay_trace
from firstlight_bench.report import write_run
from firstlight_bench.workloads import generate

__all__ = ["run_live_arms", "with_policy"]


def with_policy(config: PlatformConfig, arm: str) -> PlatformConfig:
    """``config`` routing with ``arm``; its ``router.params`` are kept only for the
    policy they were written for (a baseline takes none of firstlight's)."""
    router = config.router
    params = router.params if arm == router.policy else {}
    update: dict[str, Any] = {"policy": arm, "params": params}
    return config.model_copy(update={"router": router.model_copy(update=update)})


def run_live_arms(
    *,
    config: PlatformConfig,
    arms: Sequence[str],
    workload: str,
    seed: int,
    rate_rps: float,
    requests: int,
    out: Path,
    params: Mapping[str, Any] | None = None,
    command: str | None = None,
    max_concurrency: int = 256,
    timeout_s: float = 120.0,
    startup_timeout_s: float = 900.0,
    report: Callable[[str], None] = lambda _line: None,
) -> dict[str, Path]:
    """Run the trace once per arm against a freshly deployed local platform and write
    the run folder; returns the written paths.

    The model is the config's first. Raises ``ConfigError`` for an arm that is not a
    platform policy (``oracle`` needs the simulator's true cache) or a bad workload,
    and whatever :func:`~firstlight.serve.local_mode.start_local` raises when the platform
    does not come up (the applications of that arm are deleted first).
    """
    from firstlight.serve.local_mode import start_local, stop_local

    allowed = policy_names(platform_only=True)
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
    model = config.models[0].name
    trace = generate(
        workload,
        seed=seed,
        rate_rps=rate_rps,
        num_requests=requests,
        regions=len(config.regions),
        **dict(params or {}),
    )
    points = []
    simulated = False
    walls: dict[str, float] = {}
    targets: list[str] = []
    for arm in arms:
        report(f"{arm}: deploying {len(config.regions)} region(s)")
        running = start_local(with_policy(config, arm), report=report, timeout_s=startup_timeout_s)
        try:
            targets = [running.endpoints[r.name] for r in config.regions]
            report(f"{arm}: replaying {requests} requests at {rate_rps:g} req/s")
            started = time.monotonic()
            outcomes, arm_simulated = replay_trace(
                trace, targets, model=model, max_concurrency=max_concurrency, timeout_s=timeout_s
            )
            walls[arm] = round(time.monotonic() - started, 2)
        finally:
            stop_local(running)
        simulated = simulated or arm_simulated
        point = live_point(arm, rate_rps, outcomes)
        points.append(point)
        ttft = point["ttft_ms"]
        report(
            f"{arm}: {point['completed']} completed, {point['errors']} errors, "
            f"TTFT p50/p90 {ttft['p50']}/{ttft['p90']} ms"
        )
    meta = live_meta(
        trace,
        seed=seed,
        simulated=simulated,
        command=command,
        config={
            "targets": targets,
            "model": model,
            "arms": list(arms),
            "engines": sorted({m.engine for m in config.models}),
            "replicas_per_region": {m.name: m.replicas for m in config.models},
            "platform": config.model_dump(mode="json", include={"regions", "models", "router"}),
            "max_concurrency": max_concurrency,
            "timeout_s": timeout_s,
            "replay_wall_s": walls,
        },
        wall_s=sum(walls.values()),
    )
    return write_run(out, meta, points)
