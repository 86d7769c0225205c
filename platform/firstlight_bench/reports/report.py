"""A benchmark run's folder: ``results.json``, ``report.md`` and PNG plots.

:func:`write_run` is called once per run by the simulator and the load driver, with the
run's ``meta`` and the points :func:`firstlight_bench.reports.results.summarize` made. The plots
are drawn by :mod:`firstlight_bench.reports.plots`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from firstlight_bench.reports.day_plot import plot_run
from firstlight_bench.reports.plots import (
    plot_fraction,
    plot_ttft,
    slo_text,
    title_suffix,
    workload_name,
)
from firstlight_bench.reports.results import DEFAULT_SLOS, Slo, validate_results
from firstlight_bench.reports.spread import (
    Spread,
    best_other,
    mean_points,
    metric,
    spreads,
    verdict,
)

__all__ = ["write_run"]


Point = Mapping[str, Any]
Formatter = Callable[[float], str]


def write_run(
    out_dir: Path,
    meta: Mapping[str, Any],
    points: Sequence[Mapping[str, Any]],
    *,
    slo: Slo = DEFAULT_SLOS[0],
) -> dict[str, Path]:
    """Validate the run, then write ``results.json`` (points sorted by arm, then load),
    ``report.md`` and the plots into ``out_dir`` (created if missing); a run of a day
    (W6) gets its hour-by-hour pictures too (:func:`~firstlight_bench.reports.day_plot.plot_run`).

    ``slo`` is the pair whose TTFT bounds the "highest load within SLO" table. Returns the
    written paths keyed ``results``, ``report``, ``ttft_vs_load``, ``hit_rate_vs_load``
    and ``goodput_vs_load``. Raises ``ValueError`` (from
    :func:`~firstlight_bench.reports.results.validate_results`) when the data breaks the schema,
    before anything is written; ``OSError`` when the folder cannot be written.
    """
    ordered = sorted(points, key=lambda p: (p["arm"], p["load"], p.get("seed", -1)))
    data = {"meta": dict(meta), "points": [dict(p) for p in ordered]}
    validate_results(data)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "results": out_dir / "results.json",
        "report": out_dir / "report.md",
        "ttft_vs_load": out_dir / "ttft_vs_load.png",
        "hit_rate_vs_load": out_dir / "hit_rate_vs_load.png",
        "goodput_vs_load": out_dir / "goodput_vs_load.png",
    }
    paths["results"].write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    # Several seeds: tables and plots show each (arm, load) as its mean over the seeds.
    seeded = len({p.get("seed") for p in ordered}) > 1
    shown: list[Point] = [*mean_points(ordered)] if seeded else ordered
    paths["report"].write_text(_markdown(meta, ordered, shown, slo, paths))
    _plot(meta, shown, slo, paths)
    plot_run(out_dir)  # a day's run (W6): its hours too
    return paths


def replot(out_dir: Path, *, slo: Slo = DEFAULT_SLOS[0]) -> None:
    """Draw the plots of the run stored in ``out_dir`` again from its ``results.json``
    (what :func:`write_run` drew, with the same ``slo``), so a page's pictures always
    show the stored results beside them. Called by ``firstlight bench suite
    --tables-only``. Raises ``OSError`` or ``ValueError`` for a missing or invalid run."""
    data = json.loads((out_dir / "results.json").read_text())
    validate_results(data)
    ordered = data["points"]
    seeded = len({p.get("seed") for p in ordered}) > 1
    shown: list[Point] = [*mean_points(ordered)] if seeded else ordered
    paths = {key: out_dir / f"{key}.png" for key in _PLOTS}
    _plot(data["meta"], shown, slo, paths)
    plot_run(out_dir)


_PLOTS = ("ttft_vs_load", "hit_rate_vs_load", "goodput_vs_load")


def _plot(meta: Mapping[str, Any], shown: list[Point], slo: Slo, paths: Mapping[str, Path]) -> None:
    plot_ttft(meta, shown, slo, paths["ttft_vs_load"])
    hit_rate = ("Prefix-cache hit rate (token-weighted)", "hit rate (%)")
    plot_fraction(meta, shown, "prefix_hit_rate", hit_rate, paths["hit_rate_vs_load"])
    goodput = (f"Goodput ({slo_text(slo)})", "requests within SLO (%)")
    plot_fraction(meta, shown, "goodput", goodput, paths["goodput_vs_load"])


# --- report.md -------------------------------------------------------------------


def _ms(value: float) -> str:
    return (
        f"{value:.0f}"
        if abs(value) >= 100
        else f"{value:.1f}"
        if abs(value) >= 10
        else f"{value:.2f}"
    )


def _percent(value: float) -> str:
    return f"{value * 100:.1f}"


def _count(value: float) -> str:
    return f"{value:.0f}"


def _two(value: float) -> str:
    return f"{value:.2f}"


# (header, getter, formatter, better): better is "low", "high" or None (not ranked).
_COLUMNS: tuple[tuple[str, tuple[str, ...], Formatter, str | None], ...] = (
    ("TTFT p50 ms", ("ttft_ms", "p50"), _ms, "low"),
    ("TTFT p90 ms", ("ttft_ms", "p90"), _ms, "low"),
    ("TTFT p99 ms", ("ttft_ms", "p99"), _ms, "low"),
    ("TPOT p50 ms", ("tpot_ms", "p50"), _ms, "low"),
    ("TPOT p99 ms", ("tpot_ms", "p99"), _ms, "low"),
    ("e2e p50 ms", ("e2e_ms", "p50"), _ms, "low"),
    ("e2e p99 ms", ("e2e_ms", "p99"), _ms, "low"),
    ("hit rate %", ("prefix_hit_rate",), _percent, "high"),
    ("goodput %", ("goodput",), _percent, "high"),
    ("completed", ("completed",), _count, "high"),
    ("errors", ("errors",), _count, "low"),
    ("cross-region %", ("cross_region_share",), _percent, None),
    ("imbalance", ("imbalance",), _two, "low"),
    ("decision µs p50", ("decision_us", "p50"), _two, "low"),
    ("decision µs p99", ("decision_us", "p99"), _two, "low"),
)


_TPOT_P90: tuple[str, tuple[str, ...], Formatter, str | None] = (
    "TPOT p90 ms",
    ("tpot_ms", "p90"),
    _ms,
    "low",
)

_PREDICTION: tuple[str, tuple[str, ...], Formatter, str | None] = (
    "TTFT prediction error p50 %",
    ("prediction_ape", "p50"),
    _percent,
    None,
)

_FLOOR_COLUMNS: tuple[tuple[str, tuple[str, ...], Formatter, str | None], ...] = (
    ("TTFT p50 ÷ floor", ("ttft_vs_floor", "p50"), _two, "low"),
    ("TTFT p90 ÷ floor", ("ttft_vs_floor", "p90"), _two, "low"),
)


def _column_cells(values: list[float | None], fmt: Formatter, better: str | None) -> list[str]:
    texts = ["n/a" if v is None else fmt(v) for v in values]
    present = [v for v in values if v is not None]
    # Bold only where the arms differ as displayed; ties at the best are all bold.
    if better is None or len({fmt(v) for v in present}) < 2:
        return texts
    best = fmt(min(present) if better == "low" else max(present))
    return [f"**{t}**" if t == best else t for t in texts]


def _load_table(points: list[Point]) -> list[str]:
    chosen = _COLUMNS
    if any("p90" in p["tpot_ms"] for p in points):  # runs stored before it have no p90
        chosen = (*chosen[:4], _TPOT_P90, *chosen[4:])
    if any("prediction_ape" in p for p in points):
        chosen = (*chosen, _PREDICTION)
    if any("ttft_vs_floor" in p for p in points):
        chosen = (*chosen[:3], *_FLOOR_COLUMNS, *chosen[3:])
    columns = [
        _column_cells([metric(p, keys) for p in points], fmt, better)
        for _, keys, fmt, better in chosen
    ]
    lines = [
        "| arm | " + " | ".join(header for header, *_ in chosen) + " |",
        "|---|" + "---:|" * len(chosen),
    ]
    for row, point in enumerate(points):
        lines.append(f"| {point['arm']} | " + " | ".join(c[row] for c in columns) + " |")
    return lines


def _capacity(points: list[Point], ttft_ms: float) -> tuple[float, float] | None:
    """The highest load reached before the first load whose p99 TTFT misses ``ttft_ms``
    (a pass after a miss is noise, not capacity), with its p99 TTFT."""
    best: tuple[float, float] | None = None
    for point in sorted(points, key=lambda p: p["load"]):
        p99 = metric(point, ("ttft_ms", "p99"))
        if p99 is None or p99 > ttft_ms:
            break
        best = (float(point["load"]), p99)
    return best


def _capacity_table(by_arm: dict[str, list[Point]], slo: Slo) -> list[str]:
    found = {arm: _capacity(points, slo.ttft_ms) for arm, points in by_arm.items()}
    loads = _column_cells([c and c[0] for c in found.values()], lambda v: f"{v:g}", "high")
    lines = [
        f"| arm | highest load with p99 TTFT ≤ {slo.ttft_ms:g} ms | p99 TTFT there (ms) |",
        "|---|---:|---:|",
    ]
    for (arm, cap), load in zip(found.items(), loads, strict=True):
        if cap is None:
            lines.append(f"| {arm} | none | n/a |")
        else:
            lines.append(f"| {arm} | {load} | {_ms(cap[1])} |")
    return lines


def _spread_text(found: Spread | None) -> str:
    if found is None:
        return "n/a"
    if found.n == 1:
        return _ms(found.mean)
    return f"{_ms(found.mean)} ({_ms(found.low)} to {_ms(found.high)})"


_QUANTILES = ("p50", "p90", "p99")


def _spread_table(seeded: list[Point], load: float) -> list[str]:
    """TTFT mean (lowest to highest over the seeds) per arm at ``load``, and each arm's
    verdict at p90 and p99 against the best arm of another policy."""
    by_quantile = {
        q: {arm: s for (arm, at), s in spreads(seeded, ("ttft_ms", q)).items() if at == load}
        for q in _QUANTILES
    }
    arms = sorted({arm for by_arm in by_quantile.values() for arm in by_arm})
    lines = [
        "| arm | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | p90 vs best other | p99 vs best other |",
        "|---|---:|---:|---:|---|---|",
    ]
    for arm in arms:
        cells = [_spread_text(by_quantile[q].get(arm)) for q in _QUANTILES]
        for q in ("p90", "p99"):
            mine, other = by_quantile[q].get(arm), best_other(by_quantile[q], arm)
            if mine is None or other is None:
                cells.append("n/a")
            else:
                cells.append(f"{verdict(mine, other[1])} vs {other[0]}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def _markdown(
    meta: Mapping[str, Any],
    seeded: list[Point],
    points: list[Point],
    slo: Slo,
    paths: dict[str, Path],
) -> str:
    """The report; ``seeded`` are the stored points, ``points`` what the tables show
    (their means over the seeds when there are several)."""
    by_arm: dict[str, list[Point]] = {}
    by_load: dict[float, list[Point]] = {}
    for point in points:
        by_arm.setdefault(point["arm"], []).append(point)
        by_load.setdefault(float(point["load"]), []).append(point)
    lines = [
        f"# Firstlight benchmark: {workload_name(meta)}{title_suffix(meta)}",
        "",
        f"- simulated: {'yes' if meta['simulated'] else 'no (real platform)'}",
        f"- seed{'s' if len(meta.get('seeds', [])) > 1 else ''}: "
        f"`{', '.join(str(x) for x in meta.get('seeds', [meta['seed']]))}`",
        f"- git commit: `{meta['git_commit']}`",
        f"- created at: {meta['created_at']}",
        f"- arms: {', '.join(by_arm)}",
        "",
    ]
    if meta.get("command"):
        lines += ["Reproduce with:", "", "```sh", str(meta["command"]), "```", ""]
    for label, key in (("Workload", "workload"), ("Config", "config")):
        dumped = yaml.safe_dump(dict(meta[key]), sort_keys=False, allow_unicode=True)
        lines += [f"{label}:", "", "```yaml", dumped.rstrip(), "```", ""]
    lines += [
        "Percentiles are over completed requests; goodput is the share of all requests "
        f"that completed with {slo_text(slo)}. Best value per column in **bold** "
        "(cross-region share is context, not ranked); n/a means no samples.",
        "",
    ]
    several = points is not seeded
    if several:
        lines += [
            f"Each row is the mean over {points[0]['seeds']} seeds (the stored points hold "
            "every seed). Under each load: TTFT as mean (lowest to highest); a verdict is a "
            "win or a loss only when the two spreads do not overlap, else a tie; the "
            "other arm is the best, by mean, of another policy.",
            "",
        ]
    if any("ttft_vs_floor" in p for p in points):
        lines += [
            "`÷ floor`: the arm's TTFT percentile over the `floor` reference's (each "
            "request alone on an idle replica of its region, with every block its region "
            "saw before cached).",
            "",
        ]
    for load, at_load in sorted(by_load.items()):
        lines += [f"## Load {load:g}", "", *_load_table(at_load), ""]
        if several:
            lines += [*_spread_table(seeded, load), ""]
    lines += [
        f"## Highest load with p99 TTFT within SLO ({slo.ttft_ms:g} ms)",
        "",
        *_capacity_table(by_arm, slo),
        "",
        "## Plots",
        "",
    ]
    for key in ("ttft_vs_load", "hit_rate_vs_load", "goodput_vs_load"):
        lines += [f"![{key.replace('_', ' ')}]({paths[key].name})", ""]
    return "\n".join(lines)
