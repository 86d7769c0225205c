"""KV offload tiers, simulated: what the ``firstlight`` router gains by crediting a
prompt's host-tier blocks at their reload cost, on replicas whose device KV cache is too
small and whose host tier (vLLM's KV offloading) holds the overflow.

Run ``firstlight bench offload`` (options ``--workload W2 --requests 4000 --rates 10
--rates 15 --rates 20 --replicas 4 --profile h100-llama-8b --kv-blocks 400 --host-blocks
4000 --seeds 0 --seeds 1 --seeds 2 --out FOLDER --page PAGE``, and ``--tables-only`` to
re-render the page from a stored report; ``--rates`` and ``--seeds`` are repeated, one
value each). Everything is simulated (:mod:`firstlight_bench.simulator.des`, the same routing code
the gateway runs): without a GPU to measure on, the reload is priced at the profile's
stated ``reload_ms_per_token`` (KV bytes per token over a PCIe-like bandwidth;
:mod:`firstlight.engine.sim.profiles`), not measured.

One region of ``--replicas`` replicas, each with ``--kv-blocks`` device blocks and
``--host-blocks`` host blocks; at each offered rate, the same trace per seed through
four arms, each the ``firstlight`` policy with the operator's priors
(``firstlight_bench.simulator.sim.operator_params``):

* ``host-credited`` — the router reads the host tier from the hint mirror and prices
  its blocks at the profile's reload rate (``reload_ms_per_token``);
* ``host-as-miss`` — the router reads the device tier only (``host_tier: false``) and
  prices host-tier blocks as misses, as it did before it knew the tier; the engines
  still reload them;
* ``host-free`` — the router reads the host tier and prices it at 0 (a device hit);
* ``no-host-tier`` — the reference: the same replicas without a host tier.

Reported per rate and arm: TTFT p50, p95 and p99 and the prefix hit rate (device and
host-tier tokens over prompt tokens) of each seed, and their mean over the seeds.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight.engine.sim import get_profile
from firstlight.quantiles import percentile
from firstlight_bench.options import (
    OutOption,
    PageOption,
    TablesOnlyOption,
    rewrote_tables,
)
from firstlight_bench.reports.results import run_header, short_commit
from firstlight_bench.reports.sections import replace_tables
from firstlight_bench.simulator.cluster import ClusterSpec, block_hashes
from firstlight_bench.simulator.des import simulate
from firstlight_bench.simulator.sim import operator_params
from firstlight_bench.tools.engine import emit
from firstlight_bench.workloads import Workload, generate

__all__ = ["ARMS", "OffloadStudy", "app", "arm_cluster", "render", "run_study", "summarize"]

OFFLOAD_BEGIN = (
    "<!-- offload:begin (generated from docs/benchmarks/offload-sim/results.json; do not edit) -->"
)
OFFLOAD_END = "<!-- offload:end -->"

ARMS = ("host-credited", "host-as-miss", "host-free", "no-host-tier")
"""The arms, in the order of the report (module docstring)."""

_QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True, slots=True)
class OffloadStudy:
    """The study's settings (the command's options)."""

    workload: str = "W2"
    requests: int = 4000
    rates_rps: tuple[float, ...] = (10.0, 15.0, 20.0)
    """Offered rates (W2: turns per second), each a trace per seed."""
    replicas: int = 4
    profile: str = "h100-llama-8b"
    kv_blocks: int = 400
    """Device-tier KV blocks per replica (too few for the sessions' prefixes)."""
    host_blocks: int = 4000
    """Host-tier KV blocks per replica (KV offloading)."""
    seeds: tuple[int, ...] = (0, 1, 2)


def arm_cluster(study: OffloadStudy, arm: str, mean_output_tokens: float) -> ClusterSpec:
    """The simulated region of ``arm``: the study's replicas, with a host tier except in
    ``no-host-tier``, and the ``firstlight`` policy's parameters of the arm. Raises
    ``ValueError`` for an unknown arm."""
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r}: one of {', '.join(ARMS)}")
    profile = get_profile(study.profile)
    params = dict(operator_params(profile, mean_output_tokens)["firstlight"])
    if arm == "host-credited":
        params["reload_ms_per_token"] = profile.reload_ms_per_token
    elif arm == "host-as-miss":
        params["host_tier"] = False
    elif arm == "host-free":
        params["reload_ms_per_token"] = 0.0
    return ClusterSpec(
        1,
        study.replicas,
        profile=study.profile,
        kv_cache_blocks=study.kv_blocks,
        host_kv_blocks=0 if arm == "no-host-tier" else study.host_blocks,
        policy_params={"firstlight": params},
    )


def _trace(study: OffloadStudy, seed: int, rate_rps: float) -> Workload:
    return generate(
        study.workload, seed=seed, rate_rps=rate_rps, num_requests=study.requests, regions=1
    )


def run_arm(
    study: OffloadStudy,
    arm: str,
    seed: int,
    trace: Workload,
    hashes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, Any]:
    """One arm on one seed's trace: its TTFT quantiles (ms), hit rate and counts."""
    cluster = arm_cluster(study, arm, trace.mean_output_tokens())
    run = simulate(trace, "firstlight", cluster, seed=seed, hashes=hashes)
    ttfts = sorted(o.ttft_ms for o in run.outcomes if o.ttft_ms is not None)
    prompt = sum(o.prompt_tokens for o in run.outcomes)
    cached = sum(o.cached_tokens for o in run.outcomes)
    point: dict[str, Any] = {
        "rate_rps": trace.rate_rps,
        "arm": arm,
        "seed": seed,
        "completed": len(ttfts),
    }
    for name, q in _QUANTILES.items():
        value = percentile(ttfts, q)
        point[f"ttft_{name}_ms"] = round(value, 2) if value is not None else None
    point["hit_rate"] = round(cached / prompt, 4) if prompt else 0.0
    return point


def run_study(study: OffloadStudy, progress: Any = print) -> list[dict[str, Any]]:
    """Every arm on every rate's and seed's trace (the same trace for every arm)."""
    points = []
    for rate in study.rates_rps:
        for seed in study.seeds:
            trace = _trace(study, seed, rate)
            cluster = arm_cluster(study, ARMS[0], trace.mean_output_tokens())
            hashes = block_hashes(trace, cluster)
            for arm in ARMS:
                point = run_arm(study, arm, seed, trace, hashes)
                progress(
                    f"rate {rate:g} seed {seed} {arm:<14} TTFT p50/p95/p99 "
                    f"{point['ttft_p50_ms']}/{point['ttft_p95_ms']}/{point['ttft_p99_ms']} ms, "
                    f"hit {point['hit_rate']:.1%}"
                )
                points.append(point)
    return points


def summarize(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per rate and arm (in :data:`ARMS` order): the mean over seeds of each TTFT
    quantile and of the hit rate, with the lowest and highest seed's quantiles."""
    out = []
    rates = sorted({float(p["rate_rps"]) for p in points})
    for rate in rates:
        for arm in ARMS:
            mine = [p for p in points if p["arm"] == arm and float(p["rate_rps"]) == rate]
            if mine:
                out.append(_summary_row(rate, arm, mine))
    return out


def _summary_row(rate: float, arm: str, mine: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"rate_rps": rate, "arm": arm, "seeds": len(mine)}
    for name in _QUANTILES:
        values = [float(p[f"ttft_{name}_ms"]) for p in mine]
        row[f"ttft_{name}_ms"] = round(statistics.fmean(values), 1)
        row[f"ttft_{name}_range_ms"] = [round(min(values), 1), round(max(values), 1)]
    row["hit_rate"] = round(statistics.fmean(float(p["hit_rate"]) for p in mine), 4)
    return row


def render(report: Mapping[str, Any]) -> str:
    """The docs' table of a stored report."""
    study = report["study"]
    seeds = ", ".join(str(s) for s in study["seeds"])
    lines = [
        OFFLOAD_BEGIN,
        "",
        f"Simulated at {short_commit(report['git_commit'])} (`{report['command']}`): "
        f"{study['workload']}, {study['requests']} requests per point, "
        f"one region of {study['replicas']} `{study['profile']}` replicas with "
        f"{study['kv_blocks']} device and {study['host_blocks']} host KV blocks each, "
        f"reload {report['reload_ms_per_token'] * 1000:.2f} µs per token (stated, not "
        f"measured); seeds {seeds}. TTFT in ms, the mean over the seeds (lowest to highest "
        "seed in brackets):",
        "",
        "| rate (req/s) | arm | TTFT p50 | TTFT p95 | TTFT p99 | prefix hit rate |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["summary"]:
        cells = [
            f"{row[f'ttft_{name}_ms']:.1f} ({row[f'ttft_{name}_range_ms'][0]:.1f} to "
            f"{row[f'ttft_{name}_range_ms'][1]:.1f})"
            for name in _QUANTILES
        ]
        lines.append(
            f"| {row['rate_rps']:g} | `{row['arm']}` | "
            + " | ".join(cells)
            + f" | {row['hit_rate']:.1%} |"
        )
    lines += ["", OFFLOAD_END]
    return "\n".join(lines)


app = typer.Typer(add_completion=False)
_DEFAULTS = OffloadStudy()


@app.command()
def offload(
    workload: Annotated[str, typer.Option(help="The workload (W1..W8).")] = _DEFAULTS.workload,
    requests: Annotated[
        int, typer.Option(min=1, help="Requests per trace (one per rate and seed).")
    ] = _DEFAULTS.requests,
    rates: Annotated[
        list[float] | None,
        typer.Option(help="An offered rate, req/s (repeat; default: 10, 15 and 20)."),
    ] = None,
    replicas: Annotated[int, typer.Option(min=1, help="Replicas of the region.")] = (
        _DEFAULTS.replicas
    ),
    profile: Annotated[str, typer.Option(help="Simulator GPU profile.")] = _DEFAULTS.profile,
    kv_blocks: Annotated[
        int, typer.Option(min=1, help="Device-tier KV blocks per replica.")
    ] = _DEFAULTS.kv_blocks,
    host_blocks: Annotated[
        int, typer.Option(min=1, help="Host-tier KV blocks per replica.")
    ] = _DEFAULTS.host_blocks,
    seeds: Annotated[
        list[int] | None, typer.Option(help="A trace seed (repeat; default: 0, 1 and 2).")
    ] = None,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: TablesOnlyOption = False,
) -> None:
    """KV offload tiers, simulated: every arm at each rate on each seed's trace; prints
    the JSON report and the page's table, stores it with --out, rewrites --page's table.
    Run by a maintainer to refresh docs/routing.md."""
    if rewrote_tables(out, page, tables_only, _rewrite):
        return
    seed_list = list(seeds) if seeds else list(_DEFAULTS.seeds)
    if len(set(seed_list)) != len(seed_list):
        raise typer.BadParameter(f"{seed_list}: repeated", param_hint="--seeds")
    study = OffloadStudy(
        workload,
        requests,
        tuple(rates) if rates else _DEFAULTS.rates_rps,
        replicas,
        profile,
        kv_blocks,
        host_blocks,
        tuple(seed_list),
    )
    points = run_study(study, progress=typer.echo)
    report = {
        **run_header(),
        "simulated": True,
        "study": asdict(study),
        "reload_ms_per_token": get_profile(study.profile).reload_ms_per_token,
        "arms": list(ARMS),
        "summary": summarize(points),
        "points": points,
    }
    emit(report, out / "results.json" if out else None)
    typer.echo(render(report))
    if page is not None:
        _rewrite(page, report)


def _rewrite(page: Path, report: Mapping[str, Any]) -> None:
    page.write_text(
        replace_tables(page.read_text(), render(report), begin=OFFLOAD_BEGIN, end=OFFLOAD_END)
    )
