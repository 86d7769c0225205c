"""The live runs' tables on the benchmarks page, generated from their stored folders.

A section of a page between ``<!-- live:NAME:begin ... -->`` and ``<!-- live:NAME:end -->``
is the table of the run stored in ``<stored>/NAME/results.json`` (written by
``firstlight bench live`` or ``bench run``): one row per arm, headed by the command,
commit and engines that made it (a row per arm and seed when it has several seeds). A
section between ``<!-- live-vs-sim:NAME:begin ... -->`` and ``<!-- live-vs-sim:NAME:end -->``
sets that run beside the simulator's prediction for the same traces and fleet, stored in
``<stored>/NAME-prediction/results.json`` (:func:`live_vs_sim_table`).
:func:`render_live_sections` rewrites every such section of a page;
``firstlight bench suite --tables-only`` calls it with the suite's tables, and
``tests/bench/test_benchmarks_doc.py`` holds the page to the stored runs, so no live
figure is typed by hand either.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from firstlight_bench.reports.results import short_commit

__all__ = ["AGREEMENT", "live_table", "live_vs_sim_table", "render_live_sections"]

_SECTION = re.compile(
    r"<!-- live:(?P<name>[A-Za-z0-9._-]+):begin[^>]*-->.*?<!-- live:(?P=name):end -->",
    re.DOTALL,
)
_VERSUS = re.compile(
    r"<!-- live-vs-sim:(?P<name>[A-Za-z0-9._-]+):begin[^>]*-->.*?"
    r"<!-- live-vs-sim:(?P=name):end -->",
    re.DOTALL,
)
AGREEMENT = 0.20
"""The benchmark design's bound: a live ratio between two arms agrees with the simulated
one when they differ by at most 20 %."""
_REFERENCE = "firstlight"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def live_table(name: str, data: dict[str, Any]) -> str:
    """The section for the run ``name`` (its ``results.json`` as ``data``), markers
    included."""
    meta, points = data["meta"], data["points"]
    workload, config = meta["workload"], meta["config"]
    engines = ", ".join(config.get("engines", [])) or "as configured"
    label = "simulated engines, real platform" if meta["simulated"] else "real engines"
    commit = short_commit(str(meta["git_commit"]))
    lines = [
        f"<!-- live:{name}:begin (generated from docs/benchmarks/{name}/results.json; "
        "do not edit) -->",
        "",
        f"`{meta['command']}` at commit `{commit}`: {workload['name']}, "
        f"{workload['requests']} requests at {workload['rate_rps']:g} req/s, engines: "
        f"{engines} ({label}); [report](benchmarks/{name}/report.md).",
        "",
        "| arm | TTFT p50 / p90 / p99 ms | TPOT p50 / p99 ms | hit % | cross-region % "
        "| completed / errors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    seeds = {point.get("seed") for point in points}
    for point in points:
        ttft, tpot = point["ttft_ms"], point["tpot_ms"]
        arm = point["arm"] if len(seeds) < 2 else f"{point['arm']} (seed {point['seed']})"
        lines.append(
            f"| {arm} | {_ms(ttft['p50'])} / {_ms(ttft['p90'])} / {_ms(ttft['p99'])} "
            f"| {_ms(tpot['p50'])} / {_ms(tpot['p99'])} | {_pct(point['prefix_hit_rate'])} "
            f"| {_pct(point['cross_region_share'])} | {point['completed']} / {point['errors']} |"
        )
    lines += ["", f"<!-- live:{name}:end -->"]
    return "\n".join(lines)


def _peak(point: dict[str, Any], quantile: str) -> float | None:
    value = point.get("day", {}).get("peak", {}).get("ttft_ms", {}).get(quantile)
    return None if value is None else float(value)


def _by_arm_seed(data: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(p["arm"], int(p.get("seed", data["meta"]["seed"]))): p for p in data["points"]}


def _quotient(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or bottom is None or bottom <= 0 else top / bottom


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"\N{MULTIPLICATION SIGN}{value:.2f}"


def live_vs_sim_table(name: str, live: dict[str, Any], sim: dict[str, Any]) -> str:
    """The section setting the live run ``name`` beside the simulator's prediction
    ``sim`` (both ``results.json``), markers included: per seed both runs hold and per
    arm they share besides ``firstlight``, ``firstlight``'s TTFT p90 and p99 over each
    region's peak (``day.peak``) as a ratio to that arm's, live and simulated, and how far
    the two ratios differ (agreement within :data:`AGREEMENT`); then each arm's median
    prediction error, live and simulated."""
    lives, sims = _by_arm_seed(live), _by_arm_seed(sim)
    both = set(lives) & set(sims)
    shared = sorted(both)
    seeds = sorted({seed for _, seed in shared})
    others = sorted({arm for arm, _ in shared if arm != _REFERENCE})
    lines = [
        f"<!-- live-vs-sim:{name}:begin (generated from docs/benchmarks/{name}/results.json "
        f"and docs/benchmarks/{name}-prediction/results.json; do not edit) -->",
        "",
        f"The live run at commit `{short_commit(str(live['meta']['git_commit']))}` beside the "
        f"simulator's prediction at `{short_commit(str(sim['meta']['git_commit']))}` "
        f"([report](benchmarks/{name}-prediction/report.md)). `{_REFERENCE}`'s TTFT over "
        "each region's peak as a ratio to the other arm's; the two ratios agree when they "
        f"differ by at most {100 * AGREEMENT:.0f} %.",
        "",
        f"| seed | {_REFERENCE} ÷ | peak p90 live | simulated | agree | "
        "peak p99 live | simulated | agree |",
        "|---:|---|---:|---:|---|---:|---:|---|",
    ]
    for other in others:
        for seed in seeds:
            if (_REFERENCE, seed) not in both or (other, seed) not in both:
                continue
            cells = []
            for quantile in ("p90", "p99"):
                ratios = [
                    _quotient(
                        _peak(runs[(_REFERENCE, seed)], quantile),
                        _peak(runs[(other, seed)], quantile),
                    )
                    for runs in (lives, sims)
                ]
                gap = _quotient(ratios[0], ratios[1])
                verdict = "n/a" if gap is None else ("yes" if abs(gap - 1) <= AGREEMENT else "no")
                if gap is not None:
                    verdict += f" ({round(100 * (gap - 1)):+d} %)"
                cells += [_x(ratios[0]), _x(ratios[1]), verdict]
            lines.append(f"| {seed} | {other} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| arm | seed | TTFT prediction error p50 live % | simulated % |",
        "|---|---:|---:|---:|",
    ]
    for arm, seed in shared:
        errors = [runs[(arm, seed)].get("prediction_ape", {}).get("p50") for runs in (lives, sims)]
        if errors == [None, None]:
            continue
        lines.append(f"| {arm} | {seed} | {_pct(errors[0])} | {_pct(errors[1])} |")
    lines += ["", f"<!-- live-vs-sim:{name}:end -->"]
    return "\n".join(lines)


def render_live_sections(page: str, stored: Path) -> str:
    """``page`` with every live and live-vs-simulated section regenerated from
    ``stored/NAME/results.json`` (and ``stored/NAME-prediction/results.json``). Raises
    ``FileNotFoundError`` when a section names a run that is not stored."""

    def load(name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((stored / name / "results.json").read_text())
        return data

    def table(match: re.Match[str]) -> str:
        return live_table(match.group("name"), load(match.group("name")))

    def versus(match: re.Match[str]) -> str:
        name = match.group("name")
        return live_vs_sim_table(name, load(name), load(f"{name}-prediction"))

    return _VERSUS.sub(versus, _SECTION.sub(table, page))
