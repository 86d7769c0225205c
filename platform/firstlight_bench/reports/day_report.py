"""The tables of a multi-region day (W6) on the benchmarks page, from a stored run's
``day`` blocks (:mod:`firstlight_bench.simulator.day`): per load, each arm at the regions' peaks,
during the outage and the brownout, hour by hour against ``firstlight_local``, and what
crossed regions; then the goals of a day that presses the regions, met or not.

Called by :func:`firstlight_bench.suite.render_tables` for every run whose points carry a
``day``; a test holds the page to the stored runs through the same function.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from firstlight_bench.simulator.cluster import CROSS_REGION_ARMS

__all__ = ["day_tables"]

_BASE = "firstlight_local"
_WORSE_BY = 1.02
"""An hour counts as worse than ``firstlight_local`` when its p90 is 2 % higher."""


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _s(ms: float | None) -> str:
    if ms is None:
        return "n/a"
    return f"{ms / 1000:.1f} s" if ms >= 10_000 else f"{ms:.0f} ms"


def _event(day: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((e for e in day["events"] if e["kind"] == kind), None)


def _worse_hours(day: dict[str, Any], base: dict[str, Any]) -> tuple[int, int]:
    """Hours (per client region) whose p90 is over 2 % above the base arm's, of those
    both have."""
    mine = {(h["hour"], h["region"]): h["ttft_p90_ms"] for h in day["hours"]}
    theirs = {(h["hour"], h["region"]): h["ttft_p90_ms"] for h in base["hours"]}
    both = [k for k in mine if mine[k] is not None and theirs.get(k) is not None]
    return sum(1 for k in both if mine[k] > _WORSE_BY * theirs[k]), len(both)


def _row(
    points: list[dict[str, Any]], bases: dict[int, dict[str, Any]], tpot_q: str
) -> dict[str, Any]:
    days = [p["day"] for p in points]
    outage = [_event(d, "outage") for d in days]
    brownout = [_event(d, "brownout") for d in days]
    worse = [_worse_hours(p["day"], bases[p["seed"]]) for p in points if p.get("seed") in bases]
    hours = sum(len({h["hour"] for h in d["hours"]}) for d in days) or 1
    return {
        "peak_p90": _mean([d["peak"]["ttft_ms"]["p90"] for d in days]),
        "peak_p99": _mean([d["peak"]["ttft_ms"]["p99"] for d in days]),
        "outage_p99": _mean([e["ttft_ms"]["p99"] for e in outage if e]),
        "outage_lost": sum(e["lost"] for e in outage if e),
        "brownout_p99": _mean([e["ttft_ms"]["p99"] for e in brownout if e]),
        "brownout_lost": sum(e["lost"] for e in brownout if e),
        "worse": (sum(w for w, _ in worse), sum(n for _, n in worse)) if worse else None,
        "cross": _mean([p["cross_region_share"] for p in points]),
        "bytes_per_hour": sum(h["crossing_bytes"] for d in days for h in d["hours"]) / hours,
        "tpot": _mean([p["tpot_ms"][tpot_q] for p in points]),
        "ape": _mean([p["prediction_ape"]["p50"] for p in points if "prediction_ape" in p]),
    }


def _ratio(mine: float | None, other: float | None) -> float | None:
    return None if mine is None or not other else mine / other


def day_tables(points: list[dict[str, Any]]) -> list[str]:
    """Markdown lines for the run's day: one table per load, then the goals."""
    by_load: dict[float, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        if "day" in p:
            by_load[float(p["load"])][p["arm"]].append(p)
    lines: list[str] = []
    goals: list[str] = []
    # The goal is on TPOT p90; runs stored before points had it show p99.
    tpot_q = "p90" if all("p90" in p["tpot_ms"] for p in points if "day" in p) else "p99"
    for load in sorted(by_load):
        arms = by_load[load]
        bases = {p["seed"]: p["day"] for p in arms.get(_BASE, []) if "seed" in p}
        rows = {arm: _row(pts, bases, tpot_q) for arm, pts in arms.items()}
        lines += [
            f"The day at load {load:g} (means over the seeds; peak: each region's clients "
            "in the middle half of its slice of the day; hours worse: hours x client "
            f"regions whose TTFT p90 is over 2 % above `{_BASE}`'s):",
            "",
            "| arm | peak p90 | peak p99 | outage p99 (lost) | brownout p99 (lost) "
            f"| hours worse | served elsewhere | crossing per hour | TPOT {tpot_q} |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for arm in sorted(rows, key=lambda a: (a != "firstlight", a != _BASE, a)):
            r = rows[arm]
            worse = "n/a" if r["worse"] is None else f"{r['worse'][0]} of {r['worse'][1]}"
            cross = "n/a" if r["cross"] is None else f"{100 * r['cross']:.1f} %"
            lines.append(
                f"| {arm} | {_s(r['peak_p90'])} | {_s(r['peak_p99'])} "
                f"| {_s(r['outage_p99'])} ({r['outage_lost']}) "
                f"| {_s(r['brownout_p99'])} ({r['brownout_lost']}) | {worse} | {cross} "
                f"| {r['bytes_per_hour'] / 1e6:.2f} MB | {_s(r['tpot'])} |"
            )
        lines.append("")
        goals += _goals(load, rows, tpot_q)
    if goals:
        lines += [
            "Goals of the day (issue: regions that rescue each other), `firstlight` at each load:",
            "",
            "| load | goal | measured | verdict |",
            "|---|---|---|---|",
            *goals,
            "",
        ]
    return lines


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def _goals(load: float, rows: dict[str, dict[str, Any]], tpot_q: str) -> list[str]:
    mine, base = rows.get("firstlight"), rows.get(_BASE)
    if mine is None or base is None:
        return []
    out = []
    for q in ("p90", "p99"):
        ratio = _ratio(mine[f"peak_{q}"], base[f"peak_{q}"])
        cross = [(a, rows[a][f"peak_{q}"]) for a in CROSS_REGION_ARMS if a in rows]
        best = min(cross, key=lambda c: c[1] or float("inf")) if cross else None
        versus = _ratio(mine[f"peak_{q}"], best[1]) if best else None
        text = "n/a" if ratio is None else f"x{ratio:.2f} of {_BASE}"
        if versus is not None and best is not None:
            text += f", x{versus:.2f} of {best[0]}"
        ok = None if ratio is None else ratio <= 0.5 and (versus is None or versus <= 0.8)
        out.append(
            f"| {load:g} | peak {q} ≤ 0.5x {_BASE}, ≤ 0.8x best cross-region arm "
            f"| {text} | {_verdict(ok)} |"
        )
    for event in ("outage", "brownout"):
        ratio = _ratio(mine[f"{event}_p99"], base[f"{event}_p99"])
        lost = mine[f"{event}_lost"]
        text = "n/a" if ratio is None else f"x{ratio:.2f} of {_BASE}, {lost} lost"
        ok = None if ratio is None else ratio <= 0.5 and lost == 0
        out.append(f"| {load:g} | {event}: p99 ≤ 0.5x {_BASE}, 0 lost | {text} | {_verdict(ok)} |")
    worse = mine["worse"]
    if worse is not None:
        out.append(
            f"| {load:g} | no hour worse than {_BASE} by > 2 % | {worse[0]} of {worse[1]} "
            f"hours worse | {_verdict(worse[0] == 0)} |"
        )
    if mine["ape"] is not None:
        out.append(
            f"| {load:g} | prediction: the chosen route's TTFT, median absolute error "
            f"≤ 10 % (simulator) | {100 * mine['ape']:.1f} % | {_verdict(mine['ape'] <= 0.1)} |"
        )
    tpot = _ratio(mine["tpot"], base["tpot"])
    out.append(
        f"| {load:g} | TPOT {tpot_q} within 5 % of {_BASE} (else a TTFT win does not count) "
        f"| {'n/a' if tpot is None else f'x{tpot:.2f}'} "
        f"| {_verdict(None if tpot is None else tpot <= 1.05)} |"
    )
    return out
