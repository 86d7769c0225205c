"""The plots of a benchmark run's folder (PNG), and the titles they share with its report.

Called by :func:`firstlight_bench.reports.report.write_run`. matplotlib's Agg canvas is used
directly (no pyplot, so no global figure state and no display needed); each arm keeps one
color and marker across every plot.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from firstlight_bench.reports.results import Slo
from firstlight_bench.reports.spread import metric

__all__ = ["plot_fraction", "plot_ttft", "slo_text", "title_suffix", "workload_name"]

_FIGSIZE_IN = (12.0, 8.0)
_DPI = 100  # 1200 x 800 pixels
_MARKERS = "osD^vP*Xhp<>"

Point = Mapping[str, Any]


def workload_name(meta: Mapping[str, Any]) -> str:
    """The run's workload name for titles."""
    workload = meta["workload"]
    name = workload.get("name") or workload.get("kind")
    return str(name) if name else json.dumps(workload, sort_keys=True)


def title_suffix(meta: Mapping[str, Any]) -> str:
    """`` (simulated)`` for a simulated run, else nothing."""
    return " (simulated)" if meta["simulated"] else ""


def slo_text(slo: Slo) -> str:
    """``TTFT ≤ 500 ms & TPOT ≤ 30 ms``."""
    return f"TTFT ≤ {slo.ttft_ms:g} ms & TPOT ≤ {slo.tpot_ms:g} ms"


def _styles(points: list[Point]) -> dict[str, dict[str, Any]]:
    """A color and marker per arm, by its place in the sorted arm names, so an arm looks
    the same in every plot of the run."""
    arms = sorted({p["arm"] for p in points})
    palette = colormaps["tab10" if len(arms) <= 10 else "tab20"]
    return {
        arm: {"color": palette(i % palette.N), "marker": _MARKERS[i % len(_MARKERS)]}
        for i, arm in enumerate(arms)
    }


def _series(
    points: list[Point], arm: str, keys: tuple[str, ...], scale: float = 1.0
) -> tuple[list[float], list[float]]:
    mine = sorted((p for p in points if p["arm"] == arm), key=lambda p: p["load"])
    values = [metric(p, keys) for p in mine]
    # NaN leaves a gap in the line where an arm had no samples.
    return [float(p["load"]) for p in mine], [math.nan if v is None else v * scale for v in values]


def _new_figure() -> Figure:
    figure = Figure(figsize=_FIGSIZE_IN, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _finish(figure: Figure, path: Path) -> None:
    figure.savefig(path, format="png", dpi=_DPI)


def _style_axes(axes: Axes, ylabel: str) -> None:
    axes.set_xlabel("offered load", fontsize=12)
    axes.set_ylabel(ylabel, fontsize=12)
    axes.grid(True, which="major", alpha=0.4)
    axes.tick_params(labelsize=11)


def plot_ttft(meta: Mapping[str, Any], points: list[Point], slo: Slo, path: Path) -> None:
    figure = _new_figure()
    styles = _styles(points)
    panels = figure.subplots(1, 3, sharey=True)
    ttft_ms = [
        v for p in points for q in ("p50", "p90", "p99") if (v := p["ttft_ms"][q]) is not None
    ]
    log_scale = bool(ttft_ms) and min(ttft_ms) > 0
    for axes, quantile in zip(panels, ("p50", "p90", "p99"), strict=True):
        for arm, style in styles.items():
            loads, values = _series(points, arm, ("ttft_ms", quantile))
            axes.plot(loads, values, label=arm, linewidth=2, markersize=6, **style)
        if log_scale:
            axes.set_yscale("log")  # percentiles span orders of magnitude past the knee
            # Plain numbers at 1-2-5 steps read better than bare powers of ten.
            axes.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            axes.yaxis.set_minor_formatter(NullFormatter())
        axes.axhline(slo.ttft_ms, color="0.35", linestyle="--", linewidth=1.2)
        axes.annotate(
            f"SLO {slo.ttft_ms:g} ms",
            (0.01, slo.ttft_ms),
            xycoords=("axes fraction", "data"),
            xytext=(2, 3),
            textcoords="offset points",
            fontsize=10,
            color="0.35",
        )
        axes.set_title(f"TTFT {quantile}", fontsize=13)
        _style_axes(axes, "TTFT (ms)" if quantile == "p50" else "")
    figure.suptitle(f"TTFT vs offered load: {workload_name(meta)}{title_suffix(meta)}", fontsize=15)
    figure.legend(
        *panels[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=min(len(styles), 5),
        fontsize=11,
    )
    _finish(figure, path)


def plot_fraction(
    meta: Mapping[str, Any], points: list[Point], key: str, labels: tuple[str, str], path: Path
) -> None:
    """One line per arm of the fraction ``key`` in %; ``labels`` = (title, y label)."""
    title, ylabel = labels
    figure = _new_figure()
    axes = figure.subplots()
    for arm, style in _styles(points).items():
        loads, values = _series(points, arm, (key,), scale=100.0)
        axes.plot(loads, values, label=arm, linewidth=2, markersize=7, **style)
    axes.set_ylim(-2, 102)
    axes.set_title(
        f"{title} vs offered load: {workload_name(meta)}{title_suffix(meta)}", fontsize=15
    )
    _style_axes(axes, ylabel)
    axes.legend(fontsize=11, loc="best")
    _finish(figure, path)
