"""``firstlight bench``: the routing benchmark's commands (added to the main CLI by
:mod:`firstlight.cli`). Heavy imports (the simulator, matplotlib) happen inside the
commands, so ``firstlight --help`` stays fast."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from firstlight_bench.options import (
    command_line,
    csv_arms,
    csv_loads,
    csv_seeds,
    parse_params,
    parse_route_share_ms,
)
from firstlight_bench.registry import BenchGroup

__all__ = ["bench_app"]

bench_app = typer.Typer(
    cls=BenchGroup,
    help="Compare routing policies on the same workload: simulated at scale, or live.",
    no_args_is_help=True,
)

_KV_HELP = (
    "KV-cache blocks per replica (default: sized so the shared prefixes need 70% of the "
    "cluster's cache)."
)
_CPUS = os.cpu_count() or 1
_FLEET_HELP = (
    "A mixed fleet instead of --replicas x --profile: per region (;) NAME*COUNT parts "
    "joined by +, e.g. 'h100-llama-8b*8+a100-llama-8b*8;l4-llama-8b*16' (W8 has one)."
)
_PRESET_HELP = (
    "A published shape (llmd-b2b-saas, sglang-gsp): its workload and parameters; "
    "--param values win."
)
_ALL_ARMS = (
    "firstlight,round_robin,random,least_queue,power_of_two,cache_aware,"
    "prefix_affinity,weighted_scorer,llmd_sticky,dynamo_kv"
)


def _write_run(run: Callable[[], dict[str, Path]]) -> None:
    """Run a bench command's writer: a ``FirstlightError`` becomes a clean CLI error
    (exit 2 for configuration, 1 otherwise); on success each written path is printed."""
    from firstlight._console import fail as _fail
    from firstlight.errors import FirstlightError

    try:
        paths = run()
    except FirstlightError as exc:
        _fail(exc)
    for name, path in paths.items():
        typer.echo(f"{name}: {path}")


@bench_app.command("sim")
def bench_sim(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for results.json, report.md, PNGs (required)."),
    ] = None,
    workload: Annotated[str, typer.Option(help="W1..W8 (see --describe).")] = "W1",
    preset: Annotated[str | None, typer.Option(help=_PRESET_HELP)] = None,
    regions: Annotated[int, typer.Option(min=1, max=16)] = 4,
    replicas: Annotated[int, typer.Option(min=1, max=256, help="Per region.")] = 16,
    gateways: Annotated[
        int, typer.Option(min=1, max=16, help="Gateways (routers) per region, in turn.")
    ] = 1,
    route_share_ms: Annotated[
        str,
        typer.Option(
            help="With several gateways: ms until one router's routes reach the others "
            "(Redis pub/sub); 'off': each router counts only its own."
        ),
    ] = "1.0",
    seeds: Annotated[
        str, typer.Option(help="Comma-separated seeds: one trace each, every point on each.")
    ] = "0,1,2",
    jobs: Annotated[
        int, typer.Option(min=1, max=256, help="Processes at once (one per seed and load).")
    ] = _CPUS,
    arms: Annotated[str, typer.Option(help="Comma-separated routing arms.")] = _ALL_ARMS,
    loads: Annotated[str, typer.Option(help="Offered loads, fractions of capacity.")] = (
        "0.2,0.4,0.6,0.7,0.8,1.0,1.2"
    ),
    requests: Annotated[int, typer.Option(min=10, help="Requests per load point.")] = 2000,
    profile: Annotated[str, typer.Option(help="Simulator GPU profile.")] = "h100-llama-8b",
    fleet: Annotated[str | None, typer.Option(help=_FLEET_HELP)] = None,
    kv_blocks: Annotated[int | None, typer.Option(help=_KV_HELP)] = None,
    wan_gbps: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            max=100_000,
            help="The warm region priced: firstlight may pull a prefix's KV from the region "
            "that holds it over a link of this many Gbit/s; each such request's ways "
            "(recompute, forward, pull) are replayed in hindsight.",
        ),
    ] = None,
    hindsight_share: Annotated[
        float,
        typer.Option(
            min=0.001, max=1.0, help="With --wan-gbps: the share of warm requests replayed."
        ),
    ] = 1.0,
    param: Annotated[
        list[str] | None, typer.Option(help="Workload parameter NAME=VALUE (repeatable).")
    ] = None,
    describe: Annotated[bool, typer.Option(help="Describe the workload and exit.")] = False,
) -> None:
    """Run every arm on the same simulated trace at each load (simulated: labelled so)."""
    from firstlight._console import fail as _fail
    from firstlight.errors import FirstlightError
    from firstlight_bench.simulator.sim import run_sim
    from firstlight_bench.workloads import describe as describe_workload
    from firstlight_bench.workloads.presets import resolve_preset

    workload_params = parse_params(param or [])
    if preset is not None:
        try:
            workload, workload_params = resolve_preset(preset, workload_params)
        except FirstlightError as exc:
            _fail(exc)
    if describe:
        try:
            typer.echo(describe_workload(workload))
        except FirstlightError as exc:
            _fail(exc)
        return
    if out is None:
        raise typer.BadParameter("a folder for the run is required", param_hint="--out")
    command = command_line()
    arm_list = csv_arms(arms)
    load_list = csv_loads(loads, "--loads")
    if len(set(load_list)) != len(load_list):
        raise typer.BadParameter(f"{loads!r}: a load is repeated", param_hint="--loads")
    _write_run(
        lambda: run_sim(
            workload=workload,
            regions=regions,
            replicas=replicas,
            seeds=csv_seeds(seeds),
            arms=arm_list,
            loads=load_list,
            out=out,
            requests=requests,
            profile=profile,
            fleet=fleet,
            kv_blocks=kv_blocks,
            gateways=gateways,
            route_share_ms=parse_route_share_ms(route_share_ms),
            wan_gbps=wan_gbps,
            hindsight_share=hindsight_share,
            jobs=jobs,
            params=workload_params,
            command=command,
            progress=lambda line: typer.echo(line, err=True),
        )
    )


def _targets(urls: list[str]) -> list[str]:
    targets = [u.strip().rstrip("/") for u in urls if u.strip()]
    bad = [u for u in targets if not u.startswith(("http://", "https://"))]
    if not targets or bad:
        problem = f"{bad[0]!r} is not an http(s) URL" if bad else "at least one is needed"
        raise typer.BadParameter(problem, param_hint="--target")
    if len(set(targets)) != len(targets):
        raise typer.BadParameter("a target is repeated", param_hint="--target")
    return targets


@bench_app.command("run")
def bench_run(
    target: Annotated[
        list[str],
        typer.Option(help="A region's endpoint, e.g. http://127.0.0.1:8000/us-east (repeat)."),
    ],
    out: Annotated[Path, typer.Option("--out", help="Folder for results.json, report.md, PNGs.")],
    model: Annotated[str, typer.Option(help="The served model's name.")],
    workload: Annotated[str, typer.Option(help="W1..W6 (see bench sim --describe).")] = "W1",
    rate: Annotated[float, typer.Option(min=0.001, help="Offered load, requests/s.")] = 5.0,
    requests: Annotated[int, typer.Option(min=1)] = 50,
    label: Annotated[str, typer.Option(help="The result point's arm name.")] = "firstlight",
    seed: Annotated[int, typer.Option(min=0)] = 0,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight at most.")] = 256,
    timeout: Annotated[float, typer.Option(min=0.1, help="Per-request timeout, s.")] = 120.0,
    param: Annotated[
        list[str] | None, typer.Option(help="Workload parameter NAME=VALUE (repeatable).")
    ] = None,
) -> None:
    """Replay a workload open loop against running region gateways (live: measured from
    the client; one client region per --target)."""
    from firstlight_bench.clients.live import run_live

    command = command_line()
    targets = _targets(target)
    if not label.strip():
        raise typer.BadParameter("must not be empty", param_hint="--label")
    _write_run(
        lambda: run_live(
            targets=targets,
            workload=workload,
            seed=seed,
            rate_rps=rate,
            requests=requests,
            model=model,
            out=out,
            label=label.strip(),
            params=parse_params(param or []),
            command=command,
            max_concurrency=concurrency,
            timeout_s=timeout,
        )
    )


_LIVE_ARMS = "firstlight,round_robin,least_queue"


@bench_app.command("suite")
def bench_suite(
    out: Annotated[
        Path, typer.Option("--out", help="Folder of the run folders (one per entry).")
    ] = Path("docs/benchmarks/suite"),
    page: Annotated[
        Path, typer.Option(help="Page whose generated tables are rewritten from --out.")
    ] = Path("docs/benchmarks.md"),
    only: Annotated[str | None, typer.Option(help="Comma-separated entries (w1, w8...).")] = None,
    trace: Annotated[str | None, typer.Option(help="The Mooncake trace for w7.")] = None,
    requests: Annotated[
        int | None, typer.Option(min=10, help="Every entry's requests (smoke runs).")
    ] = None,
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0,1,2",
    loads: Annotated[str, typer.Option(help="Offered loads.")] = "0.5,0.75,0.9,1.0,1.2",
    jobs: Annotated[int, typer.Option(min=1, max=256, help="Processes at once.")] = _CPUS,
    tables_only: Annotated[
        bool, typer.Option(help="Only rewrite the page's tables from the stored runs.")
    ] = False,
    arms: Annotated[
        str | None,
        typer.Option(
            help="Re-measure only these arms (comma-separated) into the stored runs; "
            "every other arm's points stay as stored."
        ),
    ] = None,
) -> None:
    """Run the benchmark matrix into stored run folders and regenerate the page's tables
    from them, and its live runs' tables from their folders beside --out (simulated;
    every figure from a stored results.json)."""
    from firstlight._console import fail as _fail
    from firstlight.errors import FirstlightError
    from firstlight_bench.reports.live_tables import render_live_sections
    from firstlight_bench.reports.report import replot
    from firstlight_bench.reports.sections import replace_tables
    from firstlight_bench.suite import render_tables, run_suite

    if not tables_only:
        try:
            run_suite(
                out=out,
                only=[n.strip() for n in only.split(",") if n.strip()] if only else None,
                trace=trace,
                requests=requests,
                seeds=csv_seeds(seeds),
                loads=csv_loads(loads, "--loads"),
                jobs=jobs,
                command=command_line(),
                arms=[a.strip() for a in arms.split(",") if a.strip()] if arms else None,
                progress=lambda line: typer.echo(line, err=True),
            )
        except FirstlightError as exc:
            _fail(exc)
    try:
        for stored in sorted(out.glob("*/results.json")):
            replot(stored.parent)  # the pictures beside the tables show the same runs
        link_base = os.path.relpath(out, page.parent)
        text = replace_tables(page.read_text(), render_tables(out, link_base))
        page.write_text(render_live_sections(text, out.parent))
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--page") from exc
    typer.echo(f"tables: {page}")


@bench_app.command("live")
def bench_live(
    out: Annotated[Path, typer.Option("--out", help="Folder for results.json, report.md, PNGs.")],
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Platform config (default: firstlight up's)."),
    ] = None,
    engine: Annotated[
        str | None, typer.Option(help="Run every model on this engine: vllm or sim.")
    ] = None,
    replicas: Annotated[
        int | None, typer.Option(min=1, max=64, help="Replicas per region, every model.")
    ] = None,
    arms: Annotated[
        str,
        typer.Option(
            help="Comma-separated platform policies, firstlight_local, or waterfall "
            "(GKE's capacity overflow, the driver as its global load balancer)."
        ),
    ] = _LIVE_ARMS,
    workload: Annotated[str, typer.Option(help="W1..W6 (see bench sim --describe).")] = "W1",
    rate: Annotated[float, typer.Option(min=0.001, help="Offered load, requests/s.")] = 2.0,
    requests: Annotated[int, typer.Option(min=1)] = 60,
    seed: Annotated[int | None, typer.Option(min=0, help="One seed (same as --seeds N).")] = None,
    seeds: Annotated[
        str | None,
        typer.Option(help="Comma-separated seeds: one trace each, every arm on each."),
    ] = None,
    replica_capacity_rps: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="waterfall: a replica's capacity, req/s (GKE's maxRatePerEndpoint); "
            "bench sim's report states its replica_capacity_rps.",
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight at most.")] = 256,
    timeout: Annotated[float, typer.Option(min=0.1, help="Per-request timeout, s.")] = 120.0,
    param: Annotated[
        list[str] | None, typer.Option(help="Workload parameter NAME=VALUE (repeatable).")
    ] = None,
) -> None:
    """Deploy the platform locally once per arm (router.policy switched in its config),
    replay the same workload against every region, and write one report (live: measured
    from the client; labelled simulated when the engines are sim)."""
    from firstlight._console import load as _load
    from firstlight._console import prepare_models
    from firstlight.serve.local_mode import LOCAL_DEFAULT, with_engine
    from firstlight_bench.clients.live import run_live_arms

    command = command_line()
    cfg = _load(config) if config is not None else LOCAL_DEFAULT
    if engine is not None:
        if engine not in ("vllm", "sim"):
            raise typer.BadParameter(f"{engine!r}: vllm or sim", param_hint="--engine")
        cfg = with_engine(cfg, "sim" if engine == "sim" else "vllm")
    if replicas is not None:
        models = tuple(m.model_copy(update={"replicas": replicas}) for m in cfg.models)
        cfg = cfg.model_copy(update={"models": models})
    arm_list = [a.strip() for a in arms.split(",") if a.strip()]
    if len(set(arm_list)) != len(arm_list):
        raise typer.BadParameter(f"{arms!r}: an arm is repeated", param_hint="--arms")
    if seed is not None and seeds is not None:
        raise typer.BadParameter("give --seed or --seeds, not both", param_hint="--seeds")
    seed_list = csv_seeds(seeds) if seeds is not None else [seed or 0]
    prepare_models(cfg)
    _write_run(
        lambda: run_live_arms(
            config=cfg,
            arms=arm_list,
            workload=workload,
            seeds=seed_list,
            rate_rps=rate,
            requests=requests,
            out=out,
            params=parse_params(param or []),
            command=command,
            max_concurrency=concurrency,
            timeout_s=timeout,
            replica_capacity_rps=replica_capacity_rps,
            report=lambda line: typer.echo(line, err=True),
        )
    )
