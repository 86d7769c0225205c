"""The tables of one stored suite run on the benchmarks page: per load, each arm's TTFT
and goodput over the seeds with their spread and verdicts, and the day's and the warm
region's tables when the run has them.

Called by :func:`firstlight_bench.suite.render_tables` once per stored run (the goals
table before them is :mod:`firstlight_bench.reports.suite_goals`'s).
"""

from __future__ import annotations

from typing import Any

from firstlight_bench.remeasure import remeasured_note
from firstlight_bench.reports.day_report import day_tables
from firstlight_bench.reports.results import short_commit
from firstlight_bench.reports.spread import Spread, best_other, spreads, verdict
from firstlight_bench.simulator.warm import warm_table

__all__ = ["run_tables"]


def _number(value: float, mean: float) -> str:
    return f"{value:.0f}" if mean >= 100 else f"{value:.1f}"


def _ms(spread: Spread | None) -> str:
    if spread is None:
        return "n/a"
    mean, low, high = (_number(v, spread.mean) for v in (spread.mean, spread.low, spread.high))
    if spread.n == 1 or low == high:
        return mean
    return f"{mean} ({low} to {high})"


def _times(value: float) -> str:
    return f"x{value:.2f}"


def _at(points: list[dict[str, Any]], keys: tuple[str, ...], load: float) -> dict[str, Spread]:
    return {arm: s for (arm, at), s in spreads(points, keys).items() if at == load}


def run_tables(name: str, data: dict[str, Any], link_base: str) -> list[str]:
    meta, points = data["meta"], data["points"]
    loads = sorted({float(p["load"]) for p in points})
    arms = sorted(
        {p["arm"] for p in points}, key=lambda a: (a not in ("firstlight", "firstlight_local"), a)
    )
    workload = meta["workload"]
    commit = short_commit(str(meta["git_commit"]))
    config = meta["config"]
    gateways = int(config.get("gateways", 1))
    share = config.get("route_share_ms", 1.0)
    routers = ""
    if gateways > 1:
        shared = "not shared" if share is None else f"shared after {share:g} ms"
        routers = f", {gateways} gateways per region, routes {shared}"
    size = f"{workload['requests']} requests"
    if config.get("day_s"):
        size = f"a {config['day_s']:g} s day per load"
    if (config.get("profile"), config.get("replicas_per_region")) != ("h100-llama-8b", 16):
        size += (
            f", {config.get('regions')} regions x {config.get('replicas_per_region')} "
            f"{config.get('profile')}, load 1.0 by {config.get('capacity_arm', 'least_queue')}"
        )
    lines = [
        f"### {name}: {workload['name']}, {size}, seeds "
        f"{', '.join(map(str, meta.get('seeds', [meta['seed']])))} (simulated, commit "
        f"`{commit}`{remeasured_note(meta, short_commit)}, "
        f"load 1.0 = {config['capacity_rps']:.0f} req/s{routers})",
        "",
        "TTFT p90 ms, mean (lowest to highest) over the seeds; **bold**: `firstlight`'s "
        "verdict against the best arm of another policy (win/loss outside the spread):",
        "",
        "| arm | " + " | ".join(f"load {load:g}" for load in loads) + " |",
        "|---|" + "---:|" * len(loads),
    ]
    p90 = {load: _at(points, ("ttft_ms", "p90"), load) for load in loads}
    p99 = {load: _at(points, ("ttft_ms", "p99"), load) for load in loads}
    floor = {load: _at(points, ("floor_ttft_ms", "p50"), load) for load in loads}
    for arm in arms:
        lines.append(f"| {arm} | " + " | ".join(_ms(p90[load].get(arm)) for load in loads) + " |")
    lines += ["", "| `firstlight` | " + " | ".join(f"load {load:g}" for load in loads) + " |"]
    lines.append("|---|" + "---:|" * len(loads))
    for label, table in (("p90", p90), ("p99", p99)):
        cells = []
        for load in loads:
            mine, other = table[load].get("firstlight"), best_other(table[load], "firstlight")
            if mine is None or other is None:
                cells.append("n/a")
                continue
            ratio = mine.mean / other[1].mean if other[1].mean else float("inf")
            cells.append(f"**{verdict(mine, other[1])}** {_times(ratio)} vs {other[0]}")
        lines.append(f"| {label} vs best other | " + " | ".join(cells) + " |")
    p50 = {load: _at(points, ("ttft_ms", "p50"), load) for load in loads}
    cells = []
    for load in loads:
        mine, ref = p50[load].get("firstlight"), next(iter(floor[load].values()), None)
        if mine is None or ref is None or not ref.mean:
            cells.append("n/a")
        else:
            cells.append(_times(mine.mean / ref.mean))
    lines.append("| p50 ÷ floor p50 | " + " | ".join(cells) + " |")
    if "firstlight_local" in arms:
        cells = []
        for load in loads:
            spill, local = p99[load].get("firstlight"), p99[load].get("firstlight_local")
            if spill is None or local is None:
                cells.append("n/a")
            else:
                cells.append(f"{verdict(spill, local)} {_times(spill.mean / local.mean)}")
        lines.append("| p99 vs firstlight_local | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"![{name}: TTFT p50, p90 and p99 of every arm by load (simulated)]"
        f"({link_base}/{name}/ttft_vs_load.png)",
        "",
    ]
    if any("day" in p for p in points):
        lines += day_tables(points)
    if any("warm" in p for p in points):
        lines += warm_table(points, config.get("wan_gbps"))
    return lines
