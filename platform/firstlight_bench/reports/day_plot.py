"""The day of a stored W6 run, hour by hour, as a picture: ``day_load<L>.png`` in the run's
folder, one per load, for the benchmarks page.

:func:`plot_run` is called by the run writer (:mod:`firstlight_bench.reports.report`)
whenever it writes or redraws a run: for a run whose points carry ``day``
(:mod:`firstlight_bench.simulator.day`; W6) it reads the folder's ``results.json`` and
draws, for the first seed, three panels: each client region's TTFT p90 per hour under
``firstlight`` (solid) and ``firstlight_local`` (dashed), the share of each region's
requests ``firstlight`` served elsewhere, and where those went (requests per destination
region, stacked). The outage and the brownout are shaded. Figures come only from the stored
file. matplotlib's Agg canvas, as in :mod:`firstlight_bench.reports.plots`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["plot_day", "plot_run"]

_ARM, _BASE = "firstlight", "firstlight_local"


def _day(points: list[dict[str, Any]], arm: str, load: float) -> dict[str, Any] | None:
    chosen = [p for p in points if p["arm"] == arm and float(p["load"]) == load and "day" in p]
    chosen.sort(key=lambda p: p.get("seed", 0))
    return chosen[0]["day"] if chosen else None


def plot_day(points: list[dict[str, Any]], load: float, path: Path, title: str) -> bool:
    """Draw the day at ``load`` into ``path``; ``False`` (nothing written) when the run
    has no ``firstlight`` day at that load."""
    mine, base = _day(points, _ARM, load), _day(points, _BASE, load)
    if mine is None:
        return False
    regions = sorted({h["region"] for h in mine["hours"]})
    palette = colormaps["tab10"]
    figure = Figure(figsize=(12.0, 10.0), dpi=100)
    FigureCanvasAgg(figure)
    ttft, share, where = figure.subplots(3, 1, sharex=True)
    for axes in (ttft, share, where):
        for event in mine["events"]:
            color = "0.85" if event["kind"] == "outage" else "#fde2c0"
            axes.axvspan(event["start_h"], event["end_h"], color=color, zorder=0)
        axes.grid(True, alpha=0.3)
    for day, style, label in ((mine, "-", _ARM), (base, "--", _BASE)):
        if day is None:
            continue
        for g in regions:
            rows = sorted((h for h in day["hours"] if h["region"] == g), key=lambda h: h["hour"])
            ttft.plot(
                [h["hour"] + 0.5 for h in rows],
                [h["ttft_p90_ms"] for h in rows],
                style,
                color=palette(g),
                label=f"region {g} ({label})",
            )
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT p90 (ms, log)")
    ttft.legend(fontsize=8, ncol=2)
    sent: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for g in regions:
        rows = sorted((h for h in mine["hours"] if h["region"] == g), key=lambda h: h["hour"])
        share.plot(
            [h["hour"] + 0.5 for h in rows],
            [100 * (h["served_elsewhere"] or 0.0) for h in rows],
            color=palette(g),
            label=f"region {g}'s clients",
        )
        for h in rows:
            for dest, count in h["served_in"].items():
                sent[h["hour"]][int(dest)] += count
    share.set_ylabel(f"served elsewhere by {_ARM} (%)")
    share.legend(fontsize=8)
    bottom = [0] * 24
    for g in regions:
        heights = [sent[hour].get(g, 0) for hour in range(24)]
        where.bar([h + 0.5 for h in range(24)], heights, bottom=bottom, color=palette(g),
                  label=f"to region {g}", width=0.9)  # fmt: skip
        bottom = [b + x for b, x in zip(bottom, heights, strict=True)]
    where.set_ylabel("requests sent abroad")
    where.set_xlabel("hour of the day (shaded: outage grey, brownout orange)")
    where.legend(fontsize=8)
    where.set_xlim(0, 24)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path)
    return True


def plot_run(folder: Path) -> list[Path]:
    """Draw every load of the run stored in ``folder`` that has a ``firstlight`` day;
    returns the files written (none for a run without days)."""
    data = json.loads((folder / "results.json").read_text())
    meta, points = data["meta"], data["points"]
    written = []
    for load in sorted({float(p["load"]) for p in points}):
        path = folder / f"day_load{load:g}.png"
        title = (
            f"{meta['workload']['name']} at load {load:g}, seed {min(meta.get('seeds', [0]))}, "
            f"hour by hour (simulated, commit {str(meta['git_commit'])[:12]})"
        )
        if plot_day(points, load, path, title):
            written.append(path)
    return written
