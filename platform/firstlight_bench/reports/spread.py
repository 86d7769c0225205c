"""Several seeds of one benchmark point: means, spreads and verdicts.

A run over several seeds holds one point per (arm, load, seed). The report shows each
(arm, load) as the mean over its seeds with the spread (lowest to highest), and calls a
comparison a **win** or a **loss** only when the two spreads do not overlap — otherwise
a **tie** (BENCHMARKS.md: "a verdict counts only outside the spread").

Called by :mod:`firstlight_bench.reports.report` and the suite's table generator; pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "SAME_POLICY",
    "Spread",
    "Verdict",
    "best_other",
    "mean_points",
    "metric",
    "spread_of",
    "spreads",
    "verdict",
]

Point = Mapping[str, Any]
Verdict = Literal["win", "tie", "loss"]

SAME_POLICY = frozenset({"firstlight", "firstlight_local"})
"""Arms running the predicted-TTFT cost model: none of them is another arm for it."""


@dataclass(frozen=True, slots=True)
class Spread:
    """One metric over the seeds of one (arm, load)."""

    mean: float
    low: float
    high: float
    n: int


def spread_of(values: Iterable[float | None]) -> Spread | None:
    """The spread of the values that are present; ``None`` when none is."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Spread(sum(present) / len(present), min(present), max(present), len(present))


def metric(point: Point, keys: Sequence[str]) -> float | None:
    """The number at ``keys`` in ``point`` (``("ttft_ms", "p90")``), or ``None``."""
    value: Any = point
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return None if value is None else float(value)


def _group(points: Iterable[Point]) -> dict[tuple[str, float], list[Point]]:
    groups: dict[tuple[str, float], list[Point]] = {}
    for point in points:
        groups.setdefault((point["arm"], float(point["load"])), []).append(point)
    return groups


def _mean_tree(values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    first = present[0]
    if isinstance(first, Mapping):
        keys = {key: None for v in present for key in v}  # ordered union
        return {key: _mean_tree([v.get(key) for v in present]) for key in keys}
    if isinstance(first, bool | str):
        return first
    return sum(float(v) for v in present) / len(present)


def mean_points(points: Iterable[Point]) -> list[dict[str, Any]]:
    """One point per (arm, load): every number the mean over its seeds (over the seeds
    that have it), ``seed`` dropped and ``seeds`` the count; a W6 point's ``day`` (hour
    by hour, per seed) is left out: the day's tables read it per seed. Sorted by arm,
    then load."""
    out = []
    for (arm, load), group in sorted(_group(points).items()):
        merged = _mean_tree(
            [{k: v for k, v in p.items() if k not in ("seed", "day")} for p in group]
        )
        merged.update(arm=arm, load=load, seeds=len(group))
        out.append(merged)
    return out


def spreads(points: Iterable[Point], keys: Sequence[str]) -> dict[tuple[str, float], Spread]:
    """(arm, load) → the spread of the metric at ``keys`` (e.g. ``("ttft_ms", "p90")``);
    pairs where no seed has it are left out."""
    out = {}
    for group_key, group in _group(points).items():
        found = spread_of(metric(p, keys) for p in group)
        if found is not None:
            out[group_key] = found
    return out


def best_other(
    by_arm: Mapping[str, Spread], arm: str, *, lower_is_better: bool = True
) -> tuple[str, Spread] | None:
    """The best arm by mean among those not running ``arm``'s policy
    (:data:`SAME_POLICY` counts as one policy); ``None`` when there is none."""
    family = SAME_POLICY if arm in SAME_POLICY else frozenset({arm})
    others = [(name, s) for name, s in by_arm.items() if name not in family]
    if not others:
        return None
    sign = 1.0 if lower_is_better else -1.0
    return min(others, key=lambda item: (sign * item[1].mean, item[0]))


def verdict(mine: Spread, other: Spread, *, lower_is_better: bool = True) -> Verdict:
    """``win`` when ``mine``'s whole spread is better than ``other``'s, ``loss`` when it
    is worse, ``tie`` when they overlap."""
    if not lower_is_better:
        mine = Spread(-mine.mean, -mine.high, -mine.low, mine.n)
        other = Spread(-other.mean, -other.high, -other.low, other.n)
    if mine.high < other.low:
        return "win"
    if mine.low > other.high:
        return "loss"
    return "tie"
