"""The warm region in hindsight: what the cost model chose for each request whose prefix
another region held, against what each of the three ways measured when replayed.

The simulator (:mod:`firstlight_bench.simulator.des`, with ``ClusterSpec.wan_gbps``) records one
:class:`WarmRecord` per such request and, for a share of them, forks the whole
simulation at the decision and runs each way to the request's first token (every other
request routed as the arm routes it): the record's ``measured_ms``. Deterministic: a fork
that takes the way the run took measures what the run measured.
:func:`warm_metrics` turns a run's records into the point's ``warm`` block (called by
:mod:`firstlight_bench.simulator.sim`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from firstlight.region.warm import WARM_OPTIONS, WarmOption

__all__ = ["DIFFER", "WarmRecord", "warm_metrics"]

DIFFER = 0.10
"""Requests count towards the choice's hit rate when their three measured ways differ
by more than this (slowest over fastest - 1); within it of the fastest counts as best."""


@dataclass(frozen=True, slots=True)
class WarmRecord:
    """One warm request: the choice, the three prices and, if replayed, the three
    measured TTFTs (ms from its arrival, ``None`` for a way that lost it)."""

    request_id: str
    choice: WarmOption
    predicted_ms: tuple[float, float, float]
    """In :data:`~firstlight.region.warm.WARM_OPTIONS` order."""
    pull_bytes: int
    """What a pull moves (moved only when ``choice`` is ``pull``)."""
    measured_ms: tuple[float | None, float | None, float | None] | None = None

    def best(self) -> WarmOption | None:
        """The fastest way in hindsight (``None``: not replayed or nothing measured)."""
        if self.measured_ms is None:
            return None
        timed = [
            (ms, o) for ms, o in zip(self.measured_ms, WARM_OPTIONS, strict=True) if ms is not None
        ]
        return min(timed)[1] if timed else None

    def differs(self) -> bool:
        """Whether the three measured ways differ by more than :data:`DIFFER` (a way
        that lost the request differs from one that served it)."""
        if self.measured_ms is None:
            return False
        values = [ms for ms in self.measured_ms if ms is not None]
        if len(values) < len(self.measured_ms):
            return bool(values)
        return max(values) > (1 + DIFFER) * max(min(values), 1e-9)

    def chose_best(self) -> bool:
        """Whether the choice measured within :data:`DIFFER` of the fastest way."""
        if self.measured_ms is None:
            return False
        values = [ms for ms in self.measured_ms if ms is not None]
        chosen = self.measured_ms[WARM_OPTIONS.index(self.choice)]
        return bool(values) and chosen is not None and chosen <= (1 + DIFFER) * min(values)


def _ape(records: Sequence[WarmRecord], k: int) -> float | None:
    errors = [
        abs(r.predicted_ms[k] - measured) / measured * 100
        for r in records
        if r.measured_ms is not None and (measured := r.measured_ms[k]) is not None and measured > 0
    ]
    return round(statistics.median(errors), 2) if errors else None


def warm_metrics(records: Sequence[WarmRecord]) -> dict[str, Any]:
    """The point's ``warm`` block: how many warm requests, each way's share of the
    choices, the KV bytes pulled, and over the replayed ones where the ways differ by
    more than :data:`DIFFER`, the share where the choice was the best; the median error
    of each way's price against its replay."""
    replayed = [r for r in records if r.measured_ms is not None]
    differing = [r for r in replayed if r.differs()]
    count = len(records)
    return {
        "requests": count,
        "chosen": {o: sum(r.choice == o for r in records) for o in WARM_OPTIONS},
        "pulled_bytes": sum(r.pull_bytes for r in records if r.choice == "pull"),
        "replayed": len(replayed),
        "differing": len(differing),
        "best_share": (
            round(sum(r.chose_best() for r in differing) / len(differing), 4) if differing else None
        ),
        "best_way": {o: sum(r.best() == o for r in differing) for o in WARM_OPTIONS},
        "price_ape_p50": {o: _ape(replayed, k) for k, o in enumerate(WARM_OPTIONS)},
    }


def warm_table(points: Sequence[dict[str, Any]], wan_gbps: float | None) -> list[str]:
    """The benchmarks page's table of a run's ``warm`` blocks (``firstlight`` points),
    one row per load, summed over the seeds (called by :mod:`firstlight_bench.suite`)."""
    by_load: dict[float, list[dict[str, Any]]] = {}
    for point in points:
        if "warm" in point:
            by_load.setdefault(float(point["load"]), []).append(point["warm"])
    link = f"{wan_gbps:g} Gbit/s" if wan_gbps else "an unstated link"
    lines = [
        f"The warm region (`firstlight`, KV pulls over {link}; summed over the seeds): "
        "requests whose prefix another region held, the way the cost model took, and "
        "over the replayed ones whose three ways differ by more than "
        f"{DIFFER:.0%}, how often that way was the best in hindsight (within "
        f"{DIFFER:.0%} of the fastest), which way was, and each price's median error:",
        "",
        "| load | warm requests | recompute / forward / pull chosen | KV pulled GB "
        "| replayed | differ | choice best | best: recompute / forward / pull "
        "| price error p50 % recompute / forward / pull |",
        "|---:|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for load in sorted(by_load):
        blocks = by_load[load]
        chosen = [sum(b["chosen"][o] for b in blocks) for o in WARM_OPTIONS]
        best_way = [sum(b.get("best_way", {}).get(o, 0) for b in blocks) for o in WARM_OPTIONS]
        differing = sum(b["differing"] for b in blocks)
        hits = sum(round((b["best_share"] or 0) * b["differing"]) for b in blocks)
        share = f"{hits / differing:.0%}" if differing else "n/a"
        errors = []
        for o in WARM_OPTIONS:
            values = [b["price_ape_p50"][o] for b in blocks if b["price_ape_p50"].get(o)]
            errors.append(f"{statistics.mean(values):.0f}" if values else "n/a")
        lines.append(
            f"| {load:g} | {sum(b['requests'] for b in blocks)} "
            f"| {' / '.join(map(str, chosen))} "
            f"| {sum(b.get('pulled_bytes', 0) for b in blocks) / 1e9:.1f} "
            f"| {sum(b['replayed'] for b in blocks)} | {differing} | {share} "
            f"| {' / '.join(map(str, best_way))} | {' / '.join(errors)} |"
        )
    lines.append("")
    return lines
