"""Autoscaling under a load step: a model scales 1 → 2 replicas and back, and no request
fails on the way.

Run ``firstlight bench autoscale`` (options ``--engine sim|vllm --step-clients 6
--before-s 20 --hold-s 20 --after-s 20 --target-ongoing 2 --max-tokens 16
--scale-timeout-s 300 --cache-dir DIR --out FOLDER --page PAGE``; ``--tables-only``
rewrites the page from the report stored in ``--out``). One local region
(``start_local``) serves the default model with ``autoscaling`` (min 1, max 2 replicas,
Serve's autoscaler on requests in flight); closed-loop clients
(:class:`~firstlight_bench.clients.closed_loop.ClosedLoop` over plain httpx, every answer checked)
run in three phases:

* *before*: one client, for ``--before-s``;
* *step*: ``--step-clients`` more clients until Serve runs a second replica, then for
  ``--hold-s`` more;
* *after*: the step's clients stopped, until Serve is back to one replica, then for
  ``--after-s`` more.

The replica count comes from Serve's own status, polled every half second. The report
(``OUT/results.json`` with the command and commit) gives, per phase, the requests, the
failed ones and TTFT p50/p95 of the streamed ones (clients alternate streamed and JSON
requests; a JSON answer's time is the whole answer's), and when
the second replica started and stopped. With ``--engine sim`` the replicas are simulated
(the default model's CPU profile, in real time) and the report says so; the platform,
Serve's autoscaler, the router and the drain are real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight._ports import free_port
from firstlight.config import DEFAULT_MODEL_NAME, PlatformConfig, parse_config
from firstlight.quantiles import percentile
from firstlight_bench.clients.closed_loop import Answer, ClosedLoop, HttpxSender
from firstlight_bench.options import (
    EngineKind,
    OutOption,
    PageOption,
    TablesOnlyOption,
    rewrote_tables,
)
from firstlight_bench.reports.results import run_header, short_commit
from firstlight_bench.reports.sections import replace_tables
from firstlight_bench.tools.engine import emit

__all__ = ["PhaseSummary", "app", "markers", "render", "summarize"]


def markers(simulated: bool) -> tuple[str, str]:
    """The page markers around a run's tables: one pair per engine, so a simulated run
    and a vLLM run stand side by side (stored in ``docs/benchmarks/<name>``)."""
    name = "autoscale" if simulated else "autoscale-vllm"
    return (
        f"<!-- {name}:begin (generated from docs/benchmarks/{name}/results.json; do not edit) -->",
        f"<!-- {name}:end -->",
    )


_REGION = "scale"
PHASES = ("before", "step", "after")


@dataclass(frozen=True, slots=True)
class PhaseSummary:
    """What the clients saw in one phase (requests that started in it)."""

    phase: str
    requests: int
    failed: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None


def summarize(
    answers: Sequence[Answer], bounds: dict[str, tuple[float, float]]
) -> list[PhaseSummary]:
    """Per phase of ``bounds`` (name → start and end in the answers' seconds), the
    answers that started in it. Pure: called by :func:`autoscale` and the tests."""
    out = []
    for phase in PHASES:
        start, end = bounds[phase]
        inside = [a for a in answers if start <= a.outcome.arrival_s < end]
        # TTFT of the streamed requests (a JSON answer's time is the whole answer's).
        ttfts = sorted(
            ms for a in inside if a.stream and not a.lost and (ms := a.outcome.ttft_ms) is not None
        )
        out.append(
            PhaseSummary(
                phase,
                len(inside),
                sum(a.lost for a in inside),
                percentile(ttfts, 0.50),
                percentile(ttfts, 0.95),
            )
        )
    return out


def render(report: dict[str, Any]) -> str:
    """The docs' tables of a stored report."""
    label = (
        "simulated replicas (the default model's CPU profile), real platform"
        if report["simulated"]
        else "vLLM-CPU replicas of the default model"
    )
    begin, end = markers(report["simulated"])
    lines = [
        begin,
        "",
        f"Measured at {short_commit(report['git_commit'])} "
        f"(`{report['command']}`), {label}; {report['step_clients']} extra closed-loop clients "
        f"in the step, `target_ongoing_requests` {report['target_ongoing']}.",
        "",
        "| phase | replicas | requests | failed | TTFT p50 (streamed) | TTFT p95 (streamed) |",
        "|---|---|---|---|---|---|",
    ]
    replicas = {"before": "1", "step": "1 → 2", "after": "2 → 1"}
    for p in report["phases"]:
        p50 = "—" if p["ttft_p50_ms"] is None else f"{p['ttft_p50_ms']:.0f} ms"
        p95 = "—" if p["ttft_p95_ms"] is None else f"{p['ttft_p95_ms']:.0f} ms"
        lines.append(
            f"| {p['phase']} | {replicas[p['phase']]} | {p['requests']} | {p['failed']} "
            f"| {p50} | {p95} |"
        )
    up, down = report["scaled_up_after_s"], report["scaled_down_after_s"]
    lines += [
        "",
        f"The second replica ran {_seconds(up)} after the step began and was gone "
        f"{_seconds(down)} after it ended; {report['failed']} of {report['requests']} "
        "requests failed.",
        "",
        end,
    ]
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f} s"


def _config(engine: str, port: int, target: float, cache_dir: Path | None) -> PlatformConfig:
    model: dict[str, Any] = {
        "name": DEFAULT_MODEL_NAME,
        "engine": engine,
        "replicas": 1,
        "autoscaling": {
            "min_replicas": 1,
            "max_replicas": 2,
            "target_ongoing_requests": target,
            "upscale_delay_s": 2.0,
            "downscale_delay_s": 10.0,
        },
        "resources": {"num_cpus": 0},
    }
    if engine == "vllm":
        model.update({"dtype": "float32", "kv_cache_gib": 1})
    data: dict[str, Any] = {
        "mode": "local",
        "regions": [{"name": _REGION, "peers": []}],
        "models": [model],
        "auth": {"enabled": False},
        "gateway": {"host": "127.0.0.1", "port": port},
        "hints": {"key_prefix": "firstlight:autoscale:"},
    }
    if cache_dir is not None:
        data["cache_dir"] = str(cache_dir)
    return parse_config(data, "firstlight bench autoscale")


def _running_replicas() -> int:
    from ray import serve

    status = serve.status()
    app = status.applications.get(_REGION)
    if app is None:
        return 0
    return sum(
        count
        for name, d in app.deployments.items()
        if name != "gateway"
        for state, count in d.replica_states.items()
        if state == "RUNNING"  # Serve's ReplicaState is a str enum
    )


async def _until(
    count: int, within_s: float, timeline: list[tuple[float, int]], clock: Callable[[], float]
) -> float | None:
    """Poll Serve until ``count`` replicas run; the seconds it took, ``None`` on time-out."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        running = await asyncio.to_thread(_running_replicas)
        timeline.append((clock(), running))
        if running == count:
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    return None


@dataclass(frozen=True, slots=True)
class _Load:
    """The load step's shape: the command's options :func:`_measure` runs with."""

    step_clients: int
    before_s: float
    hold_s: float
    after_s: float
    max_tokens: int
    scale_timeout_s: float


async def _measure(args: _Load, endpoint: str) -> dict[str, Any]:
    sender = HttpxSender(endpoint)
    base = ClosedLoop(sender, DEFAULT_MODEL_NAME, clients=1, max_tokens=args.max_tokens)
    step = ClosedLoop(
        sender, DEFAULT_MODEL_NAME, clients=args.step_clients, max_tokens=args.max_tokens
    )
    timeline: list[tuple[float, int]] = []
    base.start()
    await asyncio.sleep(args.before_s)
    step_at = base.now_s()
    step.start(origin=base.origin)  # the step's answers on the base load's time base
    up = await _until(2, args.scale_timeout_s, timeline, base.now_s)
    await asyncio.sleep(args.hold_s)
    await step.stop()
    after_at = base.now_s()
    down = await _until(1, args.scale_timeout_s, timeline, base.now_s)
    await asyncio.sleep(args.after_s)
    answers = await base.stop()
    end = base.now_s()
    everything = [*answers, *step.answers]
    bounds = {"before": (0.0, step_at), "step": (step_at, after_at), "after": (after_at, end)}
    phases = summarize(everything, bounds)
    return {
        "phases": [asdict(p) for p in phases],
        "requests": len(everything),
        "failed": sum(a.lost for a in everything),
        "problems": sorted({a.outcome.error for a in everything if a.outcome.error is not None}),
        "scaled_up_after_s": up,
        "scaled_down_after_s": down,
        "replica_timeline": timeline,
    }


app = typer.Typer(add_completion=False)


@app.command()
def autoscale(
    engine: Annotated[
        EngineKind, typer.Option(help="Replicas on vLLM, or simulated (real platform).")
    ] = EngineKind.SIM,
    step_clients: Annotated[
        int, typer.Option(min=1, help="Closed-loop clients the step adds.")
    ] = 6,
    target_ongoing: Annotated[
        float, typer.Option(help="Serve's target_ongoing_requests (above 0, at most 1024).")
    ] = 2.0,
    before_s: Annotated[float, typer.Option(min=0.0, help="Seconds of one client first.")] = 20.0,
    hold_s: Annotated[
        float, typer.Option(min=0.0, help="Seconds the step holds once 2 replicas run.")
    ] = 20.0,
    after_s: Annotated[
        float, typer.Option(min=0.0, help="Seconds after Serve is back to 1 replica.")
    ] = 20.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="max_tokens of each request.")] = 16,
    scale_timeout_s: Annotated[
        float, typer.Option(min=0.0, help="Seconds to wait for each scaling.")
    ] = 300.0,
    cache_dir: Annotated[
        Path | None, typer.Option(help="The platform's cache_dir (default: its own).")
    ] = None,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: TablesOnlyOption = False,
) -> None:
    """A load step on one local region: the default model scales 1 -> 2 replicas and
    back. Prints the JSON report and its tables, stores it with --out, rewrites --page's
    section. Run as firstlight bench autoscale (the module's docstring has the phases)."""
    if rewrote_tables(out, page, tables_only, _rewrite):
        return
    if not 0 < target_ongoing <= 1024:
        raise typer.BadParameter(
            f"{target_ongoing}: above 0 and at most 1024", param_hint="--target-ongoing"
        )
    import ray

    from firstlight.serve.local_mode import start_local, stop_local

    load = _Load(step_clients, before_s, hold_s, after_s, max_tokens, scale_timeout_s)
    config = _config(engine.value, free_port(), target_ongoing, cache_dir)
    running = start_local(config, timeout_s=600)
    try:
        measured = asyncio.run(_measure(load, running.endpoints[_REGION]))
    finally:
        stop_local(running)
        ray.shutdown()
    report = {
        **run_header(),
        "simulated": engine is EngineKind.SIM,
        "step_clients": step_clients,
        "target_ongoing": target_ongoing,
        **measured,
    }
    emit(report, out / "results.json" if out else None)
    typer.echo(render(report))
    if page is not None:
        _rewrite(page, report)


def _rewrite(page: Path, report: dict[str, Any]) -> None:
    text = page.read_text()
    begin, end = markers(report["simulated"])
    page.write_text(replace_tables(text, render(report), begin=begin, end=end))
