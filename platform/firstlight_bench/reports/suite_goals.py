"""The routing goals, checked against the stored suite runs.

One table for the benchmarks page, generated like the suite's other tables (called by
:func:`firstlight_bench.suite.render_tables`), so the verdicts on the goals are never
typed by hand either. The goals are the routing issue's, over the suite's matrix:

* **never the worse choice**: at every point ``firstlight``'s TTFT p90 and p99 are at
  most the best other arm's, or within the seeds' spread of it;
* **a clear win where the idea pays**: on W6, W7 and W8 at loads ≥ 0.9, p90 ≤ 0.7x the
  best other arm's, outside the spread;
* **close to the limit**: p50 ≤ 1.2x ``floor``'s at loads ≤ 0.75 on W1, W2, W4 and W7;
* **spill-over never hurts**: ``firstlight``'s p99 never above ``firstlight_local``'s
  outside the spread (and on W6, by how much it lowers it);
* **no loss where nobody tuned**: the first goal again, on the entries whose fleet shapes
  and seeds no parameter was tuned on (``SuiteEntry.unseen``).

Each row says what was measured and where; an entry not stored yet is named as missing.
Pure: takes the parsed ``results.json`` files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from firstlight_bench.reports.spread import Spread, best_other, spreads, verdict

__all__ = ["goals_table"]

Run = Mapping[str, Any]


def _by_load(run: Run, keys: tuple[str, ...]) -> dict[float, dict[str, Spread]]:
    out: dict[float, dict[str, Spread]] = {}
    for (arm, load), spread in spreads(run["points"], keys).items():
        out.setdefault(load, {})[arm] = spread
    return out


def _losses(name: str, run: Run, label: str, keys: tuple[str, ...]) -> tuple[int, list[str]]:
    """(points compared, "name@load (ratio vs arm)" for each loss of firstlight)."""
    compared, lost = 0, []
    for load, arms in sorted(_by_load(run, keys).items()):
        mine, other = arms.get("firstlight"), best_other(arms, "firstlight")
        if mine is None or other is None:
            continue
        compared += 1
        if verdict(mine, other[1]) == "loss":
            ratio = mine.mean / other[1].mean if other[1].mean else float("inf")
            lost.append(f"{name} {label} at {load:g} (x{ratio:.2f} vs {other[0]})")
    return compared, lost


def _never_worse(
    runs: Mapping[str, Run], goal: str = "never the worse choice (p90 and p99, every point)"
) -> str:
    compared, lost = 0, []
    for name, run in runs.items():
        for label, keys in (("p90", ("ttft_ms", "p90")), ("p99", ("ttft_ms", "p99"))):
            n, found = _losses(name, run, label, keys)
            compared += n
            lost += found
    result = f"{len(lost)} losses in {compared} comparisons" + (
        ": " + "; ".join(lost) if lost else ""
    )
    return f"| {goal} | {result} | {_met(not lost, compared > 0)} |"


def _clear_win(runs: Mapping[str, Run]) -> str:
    cells, met, seen = [], True, False
    for name, run in runs.items():
        if run["meta"]["workload"]["name"] not in ("W6", "W7", "W8"):
            continue
        for load, arms in sorted(_by_load(run, ("ttft_ms", "p90")).items()):
            mine, other = arms.get("firstlight"), best_other(arms, "firstlight")
            if load < 0.9 or mine is None or other is None:
                continue
            seen = True
            ratio = mine.mean / other[1].mean if other[1].mean else float("inf")
            ok = ratio <= 0.7 and verdict(mine, other[1]) == "win"
            met &= ok
            cells.append(f"{name} {load:g}: x{ratio:.2f}")
    result = ", ".join(cells) if cells else "no W6/W7/W8 run stored"
    goal = "p90 ≤ 0.7x best other on W6, W7, W8 at loads ≥ 0.9"
    return f"| {goal} | {result} | {_met(met, seen)} |"


def _near_floor(runs: Mapping[str, Run]) -> str:
    cells, met, seen = [], True, False
    for name, run in runs.items():
        if run["meta"]["workload"]["name"] not in ("W1", "W2", "W4", "W7"):
            continue
        p50 = _by_load(run, ("ttft_ms", "p50"))
        floor = _by_load(run, ("floor_ttft_ms", "p50"))
        worst = None
        for load, arms in p50.items():
            mine = arms.get("firstlight")
            ref = next(iter(floor.get(load, {}).values()), None)
            if load > 0.75 or mine is None or ref is None or not ref.mean:
                continue
            ratio = mine.mean / ref.mean
            worst = ratio if worst is None else max(worst, ratio)
        if worst is not None:
            seen = True
            met &= worst <= 1.2
            cells.append(f"{name}: x{worst:.2f}")
    result = "highest p50 ÷ floor p50: " + ", ".join(cells) if cells else "no run stored"
    goal = "p50 ≤ 1.2x floor at loads ≤ 0.75 on W1, W2, W4, W7"
    return f"| {goal} | {result} | {_met(met, seen)} |"


def _spill_over(runs: Mapping[str, Run]) -> str:
    compared, raised, w6 = 0, [], []
    for name, run in runs.items():
        for load, arms in sorted(_by_load(run, ("ttft_ms", "p99")).items()):
            spill, local = arms.get("firstlight"), arms.get("firstlight_local")
            if spill is None or local is None:
                continue
            compared += 1
            ratio = spill.mean / local.mean if local.mean else float("inf")
            if verdict(spill, local) == "loss":
                raised.append(f"{name} at {load:g} (x{ratio:.2f})")
            if run["meta"]["workload"]["name"] == "W6":
                w6.append(f"{load:g}: x{ratio:.2f}")
    result = f"raised in {len(raised)} of {compared} points" + (
        ": " + "; ".join(raised) if raised else ""
    )
    if w6:
        result += "; W6 p99 ÷ firstlight_local's at " + ", ".join(w6)
    goal = "spill-over never raises p99 against firstlight_local"
    return f"| {goal} | {result} | {_met(not raised, compared > 0)} |"


def _met(ok: bool, measured: bool) -> str:
    if not measured:
        return "not measured"
    return "met" if ok else "**missed**"


def goals_table(
    stored: Mapping[str, Run],
    expected: Sequence[str],
    loads: Sequence[float],
    *,
    unseen: Mapping[str, Run] | None = None,
) -> list[str]:
    """The goals table's lines for the ``stored`` runs (entry name → results) at the
    matrix's ``loads`` (points at other loads, such as a stress entry's, do not count),
    naming the entries of ``expected`` that are not stored; ``unseen``: the untuned
    shapes' runs, for the last row (absent: no row)."""
    runs = {}
    for name, run in stored.items():
        points = [p for p in run["points"] if float(p["load"]) in loads]
        if points:
            runs[name] = {"meta": run["meta"], "points": points}
    missing = [name for name in expected if name not in stored]
    lines = [
        "| goal | measured (firstlight, mean over the seeds) | verdict |",
        "|---|---|---|",
        _never_worse(runs),
        _clear_win(runs),
        _near_floor(runs),
        _spill_over(runs),
    ]
    if unseen is not None:
        goal = f"no loss where nobody tuned ({', '.join(sorted(unseen)) or 'none stored'})"
        lines.append(_never_worse(unseen, goal))
    lines.append("")
    if missing:
        lines += [f"Not stored yet, so not counted: {', '.join(missing)}.", ""]
    return lines
