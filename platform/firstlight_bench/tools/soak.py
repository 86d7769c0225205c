"""The soak run: steady load for minutes on a local two-region platform, watching for
what only time shows — lost requests, memory growth and who owns it, leaked asyncio tasks.

``firstlight bench soak --minutes 60 --out FOLDER`` (``--help`` lists every option)
deploys two emulated regions on the ``sim`` engine (results are labelled simulated), runs
closed-loop :class:`~firstlight_bench.clients.closed_loop.ClosedLoop` clients against both, and
every ``--sample-s`` seconds reads the resident memory of every gateway and model replica
process (``/proc``; Ray names its processes ``ray::ServeReplica:<app>:<deployment>``)
and each gateway's ``firstlight_gateway_asyncio_tasks``.

Memory growth is measured from the end of the warm-up (``--warmup-s``, by default a third
of the run: caches and pools fill first) to the end, so a 60-minute run measures the last
40 minutes. With ``--tracemalloc`` (the default) every gateway traces its Python
allocations from before the load (``--frames`` frames per traceback); at the end of the
warm-up each takes a baseline, at the end the growth since then is grouped by owner
(:mod:`firstlight.telemetry.memory`; the gateways are reached through their deployment
handles, :mod:`firstlight_bench.tools.soak_memory`). RSS is read before each snapshot, so the
snapshot's own transient memory is not in the figure it is compared with (the report
shows how much RSS rose while the baseline was taken). Tracing costs the gateways CPU,
so the latencies of a traced run are not those of an untraced one, and it stays on until
the platform is deleted (:meth:`firstlight.telemetry.memory.MemoryTracer.stop`).
Asyncio tasks are compared idle before the load and idle after it, so a task per request
that never ends shows as a difference.

With ``--out`` the run is stored as ``results.json`` and ``report.md``; with ``--page``
the generated section of that doc page is rewritten (``--tables-only``: from the stored
``results.json``, without running; :mod:`firstlight_bench.reports.soak_report`). Tests call
:func:`soak` with a platform of their own for a short run. What it reads of the replica
processes and the gateways' tasks is :mod:`firstlight_bench.tools.soak_probes`'s.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import httpx
import typer

from firstlight.config import PlatformConfig, parse_config
from firstlight.quantiles import percentile
from firstlight_bench import options
from firstlight_bench.clients.closed_loop import Answer, ClosedLoop, HttpxSender
from firstlight_bench.reports.results import Outcome, run_header
from firstlight_bench.reports.soak_report import (
    SOAK_BEGIN,
    SOAK_END,
    has_markers,
    rewrite_page,
    write_run,
)
from firstlight_bench.tools.soak_memory import GatewayMemory
from firstlight_bench.tools.soak_probes import asyncio_tasks, gateway_pids, idle_tasks, rss_now

__all__ = ["SoakReport", "app", "soak", "soak_config"]

Report = Callable[[str], None]
_MIB = 1024.0 * 1024.0
REGIONS = ("soak-east", "soak-west")
MODEL_REPLICAS = 2
"""Model replicas per region (the gateways per region: ``gateway.replicas``' default)."""


@dataclass
class SoakReport:
    """What a soak run measured (times in seconds, memory in MiB)."""

    duration_s: float
    clients_per_region: int
    requests: int = 0
    lost: int = 0
    hung: int = 0
    ttft_ms_first_minute: dict[str, float | None] = field(default_factory=dict)
    ttft_ms_last_minute: dict[str, float | None] = field(default_factory=dict)
    rss_mib: dict[str, list[float]] = field(default_factory=dict)
    """Process (``<region>/<deployment>#<pid>``) → RSS at each sample."""
    sample_at_s: list[float] = field(default_factory=list)
    tasks_idle_before: dict[str, int] = field(default_factory=dict)
    tasks_idle_after: dict[str, int] = field(default_factory=dict)
    tasks_under_load: dict[str, list[int]] = field(default_factory=dict)
    hint_blocks: dict[str, list[int]] = field(default_factory=dict)
    """Region → (replica, block) entries in its gateway's hint mirror at each sample:
    state that grows with distinct prompts until the replicas' caches evict or the hints
    expire (``hints.ttl_s``)."""
    problems: dict[str, int] = field(default_factory=dict)
    warmup_s: float = 0.0
    """Growth is measured from the sample at this time to the last."""
    rss_mib_at_warmup: dict[str, float] = field(default_factory=dict)
    """Process → RSS at the end of the warm-up (before the gateways' baselines)."""
    tracemalloc_frames: int = 0
    """Frames per traceback the gateways traced with; 0: not traced."""
    rss_mib_after_baseline: dict[str, float] = field(default_factory=dict)
    """Process → RSS right after the gateways took their baselines."""
    traced_mib: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Gateway process → ``(time, traced MiB)`` at each sample it answered."""
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Gateway process → its traced growth since the baseline
    (:class:`firstlight.telemetry.memory.MemoryGrowth` as a dict)."""
    memory_problems: list[str] = field(default_factory=list)
    """Gateways the memory asks did not reach, and errors."""

    def rss_at_warmup(self, process: str) -> float:
        """RSS of ``process`` at the end of the warm-up (its first sample without one)."""
        return self.rss_mib_at_warmup.get(process, self.rss_mib[process][0])

    def growth_pct(self, process: str) -> float:
        """RSS growth of ``process`` from the end of the warm-up to the last sample."""
        first, last = self.rss_at_warmup(process), self.rss_mib[process][-1]
        return (last - first) / first * 100.0

    def markdown(self) -> str:
        """A short summary for the console (the stored report:
        :func:`firstlight_bench.reports.soak_report.render`)."""
        lines = [
            f"soak: {self.duration_s / 60:.1f} min, {self.clients_per_region} closed-loop "
            f"clients per region, sim engine (simulated): {self.requests} requests, "
            f"{self.lost} lost, {self.hung} hung",
            "",
            "| process | RSS at warm-up end (MiB) | RSS last (MiB) | growth |",
            "|---|---|---|---|",
        ]
        for process, samples in sorted(self.rss_mib.items()):
            lines.append(
                f"| {process} | {self.rss_at_warmup(process):.0f} | {samples[-1]:.0f} | "
                f"{self.growth_pct(process):+.1f} % |"
            )
        lines += [
            "",
            "| gateway | asyncio tasks idle before | under load (min to max) | idle after |",
        ]
        lines.append("|---|---|---|---|")
        for region in sorted(self.tasks_idle_before):
            loaded = self.tasks_under_load.get(region) or [0]
            lines.append(
                f"| {region} | {self.tasks_idle_before[region]} | {min(loaded)} to {max(loaded)} "
                f"| {self.tasks_idle_after.get(region, -1)} |"
            )
        lines.append("")
        for region, blocks in sorted(self.hint_blocks.items()):
            lines.append(
                f"hint mirror of {region}: {blocks[0]} entries at the first sample, "
                f"{max(blocks)} at most, {blocks[-1]} at the last"
            )
        for region in sorted(self.ttft_ms_first_minute):
            first = _ms(self.ttft_ms_first_minute[region])
            last = _ms(self.ttft_ms_last_minute.get(region))
            lines.append(f"TTFT p99 in {region}: first minute {first}, last {last}")
        for process, grown in sorted(self.memory.items()):
            owners = ", ".join(
                f"{o['owner']} {o['size_bytes'] / _MIB:+.2f}" for o in grown["owners"][:5]
            )
            lines.append(
                f"traced growth of {process}: {grown['traced_growth_bytes'] / _MIB:+.2f} MiB "
                f"({owners}, ...)"
            )
        lines += [f"memory: {problem}" for problem in self.memory_problems]
        return "\n".join(lines)


def soak_config(port: int) -> PlatformConfig:
    """The soak run's platform: two regions 40 ms apart, ``sim`` replicas with the
    default model's CPU costs, its own Redis key prefix."""
    model = {"name": "sim-soak", "engine": "sim", "max_model_len": 4096,
             "resources": {"num_cpus": 0}}  # fmt: skip
    east, west = REGIONS
    return parse_config(
        {
            "mode": "local",
            "regions": [
                {"name": east, "peers": [{"region": west, "rtt_ms": 40}]},
                {"name": west, "peers": [{"region": east, "rtt_ms": 40}]},
            ],
            "models": [{**model, "replicas": MODEL_REPLICAS}],
            "hints": {"key_prefix": f"firstlight:soak:{uuid.uuid4().hex[:8]}:"},
            "gateway": {"host": "127.0.0.1", "port": port},
        },
        "soak run",
    )


def sample_times(duration_s: float, sample_s: float, warmup_s: float) -> list[float]:
    """When to sample, in seconds after the load started, besides the last sample at
    ``duration_s``: every ``sample_s`` and at the end of the warm-up."""
    times = {min(warmup_s, duration_s)}
    at = sample_s
    while at < duration_s:
        times.add(at)
        at += sample_s
    return sorted(t for t in times if t < duration_s or t == warmup_s)


async def soak(
    endpoints: Mapping[str, str],
    model: str,
    duration_s: float,
    *,
    clients: int = 3,
    sample_s: float = 30.0,
    warmup_s: float = 30.0,
    tracemalloc_frames: int = 0,
    top_owners: int = 15,
    report: Report = print,
) -> SoakReport:
    """Load every region of ``endpoints`` for ``duration_s`` and measure (see the
    module docstring). Needs the platform's processes on this machine; with
    ``tracemalloc_frames`` > 0 also the platform's Ray cluster (this process started it),
    whose gateways then trace their allocations."""
    warmup_s = min(warmup_s, duration_s)
    result = SoakReport(duration_s, clients, warmup_s=warmup_s)
    regions = list(endpoints)
    memory: GatewayMemory | None = None
    if tracemalloc_frames > 0:
        memory = GatewayMemory(regions, gateway_pids)
        started_tracing = await _ask(result, memory, "memory_start", tracemalloc_frames)
        result.tracemalloc_frames = max((s.frames for s in started_tracing.values()), default=0)
        report(f"  tracemalloc on in {len(started_tracing)} gateways")
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        result.tasks_idle_before = await idle_tasks(client, endpoints)
        loads = {
            region: ClosedLoop(HttpxSender(url), model, clients, max_tokens=16, prompt_words=60)
            for region, url in endpoints.items()
        }
        for load in loads.values():
            load.start()
        started = time.monotonic()
        for at in sample_times(duration_s, sample_s, warmup_s):
            await asyncio.sleep(max(started + at - time.monotonic(), 0.0))
            rss = await _sample(result, client, endpoints, memory, time.monotonic() - started)
            if at == warmup_s:
                result.rss_mib_at_warmup = rss
                if memory is not None:
                    await _ask(result, memory, "memory_baseline", "warm-up end")
                    result.rss_mib_after_baseline = rss_now(regions)
            served = sum(len(load.answers) for load in loads.values())
            report(f"  {result.sample_at_s[-1]:6.0f} s: {served} requests answered")
        await asyncio.sleep(max(started + duration_s - time.monotonic(), 0.0))
        await _sample(result, client, endpoints, memory, time.monotonic() - started)
        end_s = time.monotonic() - started
        if memory is not None:
            grown = await _ask(result, memory, "memory_growth", "end", top_owners)
            result.memory = {process: asdict(g) for process, g in sorted(grown.items())}
        answers = {region: await load.stop() for region, load in loads.items()}
        result.tasks_idle_after = await idle_tasks(client, endpoints)
    _count(result, answers, end_s)
    return result


async def _ask(
    result: SoakReport, memory: GatewayMemory, method: str, *args: Any
) -> dict[str, Any]:
    answers, problems = await memory.ask(method, *args)
    result.memory_problems += [p for p in problems if p not in result.memory_problems]
    return dict(answers)


def _count(result: SoakReport, answers: Mapping[str, list[Answer]], end_s: float) -> None:
    """Requests, losses and TTFT p99 of the first and the last minute before ``end_s``
    (the last sample: the end's snapshots slow the requests after it)."""
    everything = [a for region_answers in answers.values() for a in region_answers]
    result.requests = len(everything)
    result.lost = sum(a.lost for a in everything)
    result.hung = sum(a.hung for a in everything)
    for a in everything:
        if (problem := a.outcome.error) is not None:
            result.problems[problem] = result.problems.get(problem, 0) + 1
    for region, region_answers in answers.items():
        outcomes = [a.outcome for a in region_answers]
        result.ttft_ms_first_minute[region] = _p99(outcomes, 0.0, 60.0)
        result.ttft_ms_last_minute[region] = _p99(outcomes, end_s - 60, end_s)


async def _sample(
    result: SoakReport,
    client: httpx.AsyncClient,
    endpoints: Mapping[str, str],
    memory: GatewayMemory | None,
    at_s: float,
) -> dict[str, float]:
    """Read every process's RSS first (before anything the gateways do for the sample),
    then the gateways' tasks, hint mirrors and traced bytes; returns the RSS read."""
    result.sample_at_s.append(at_s)
    rss = rss_now(list(endpoints))
    for process, mib in rss.items():
        result.rss_mib.setdefault(process, []).append(mib)
    for region, url in endpoints.items():
        result.tasks_under_load.setdefault(region, []).append(await asyncio_tasks(client, url))
        hints = (await client.get(f"{url}/readyz")).json()["hints"]
        blocks = sum(int(model["blocks"]) for model in hints.values())
        result.hint_blocks.setdefault(region, []).append(blocks)
    if memory is not None:
        for process, status in (await _ask(result, memory, "memory_status")).items():
            point = (round(at_s, 1), status.traced_bytes / _MIB)
            result.traced_mib.setdefault(process, []).append(point)
    return rss


def _p99(outcomes: Iterable[Outcome], since_s: float, until_s: float) -> float | None:
    """p99 TTFT (ms) of the ``outcomes`` sent in [since_s, until_s); ``None``: no TTFT."""
    ttfts = (o.ttft_ms for o in outcomes if since_s <= o.arrival_s < until_s)
    return percentile(sorted(ms for ms in ttfts if ms), 0.99)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


app = typer.Typer(add_completion=False)


@app.command("soak")
def soak_command(
    minutes: Annotated[float, typer.Option(help="Length of the load (> 0).")] = 10.0,
    clients: Annotated[int, typer.Option(min=1, help="Closed-loop clients per region.")] = 3,
    sample_s: Annotated[float, typer.Option(help="Seconds between samples (> 0).")] = 30.0,
    warmup_s: Annotated[
        float | None,
        typer.Option(min=0, help="Load before growth is measured (default: a third of the run)."),
    ] = None,
    port: Annotated[int, typer.Option(help="The HTTP proxy's port.")] = 8300,
    tracemalloc: Annotated[
        bool, typer.Option(help="Trace the gateways' Python allocations; group growth by owner.")
    ] = True,
    frames: Annotated[int, typer.Option(min=1, max=64, help="Frames traced per allocation.")] = 4,
    top: Annotated[int, typer.Option(min=1, help="Owners listed per gateway.")] = 15,
    out: options.OutOption = None,
    page: options.PageOption = None,
    tables_only: options.TablesOnlyOption = False,
) -> None:
    """Steady load on two local sim regions for --minutes (run as firstlight bench soak):
    lost requests, memory growth by owner, leaked tasks. Stores the run with --out, rewrites
    --page's section (--tables-only: only that, from --out); exits 1 if a request was lost."""
    if options.rewrote_tables(out, page, tables_only, rewrite_page):
        return
    if not (minutes > 0 and sample_s > 0):  # typer's bounds include their limit
        bad, value = ("--minutes", minutes) if not minutes > 0 else ("--sample-s", sample_s)
        raise typer.BadParameter(f"{value:g}: must be more than 0", param_hint=bad)
    duration_s = minutes * 60.0
    warmup_s = duration_s / 3.0 if warmup_s is None else warmup_s
    if not warmup_s < duration_s:
        message = f"{warmup_s:g}: from 0 to less than the run ({duration_s:g} s)"
        raise typer.BadParameter(message, param_hint="--warmup-s")
    if page is not None and not has_markers(page):
        message = f"{page}: no {SOAK_BEGIN} ... {SOAK_END} section to rewrite"
        raise typer.BadParameter(message, param_hint="--page")

    import ray

    from firstlight.serve.local_mode import start_local, stop_local

    config = soak_config(port)
    typer.echo(f"soak: deploying {', '.join(r.name for r in config.regions)} (sim engine)")
    platform = start_local(config, report=lambda m: typer.echo(f"  {m}"), num_cpus=2)
    try:
        result = asyncio.run(
            soak(
                platform.endpoints, config.models[0].name, duration_s, clients=clients,
                sample_s=sample_s, warmup_s=warmup_s, top_owners=top, report=typer.echo,
                tracemalloc_frames=frames if tracemalloc else 0,
            )
        )  # fmt: skip
    finally:
        stop_local(platform)
        ray.shutdown()  # the cluster start_local started for this run
    stored = {
        **run_header(),
        "simulated": True,
        "regions": len(config.regions),
        "model_replicas": MODEL_REPLICAS,
        "gateways_per_region": config.gateway.replicas,
        "sample_s": sample_s,
        **asdict(result),
    }
    typer.echo(result.markdown())
    if out is not None:
        write_run(out, stored)
        typer.echo(f"written to {out}/results.json and report.md")
    if page is not None:
        rewrite_page(page, stored)
    if result.lost:
        raise typer.Exit(1)
