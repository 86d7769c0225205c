"""The project's one percentile: the dashboard, the telemetry windows, the benchmarks
and the tests all report p50/p90/p95/p99 with it, so two figures of one quantity never
differ by method. Pure; imports nothing of the package."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["percentile", "quantile"]


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) of already sorted values, by linear interpolation
    between closest ranks (numpy's default, Hyndman & Fan type 7); ``None`` for no
    values. Raises ``ValueError`` for ``q`` outside 0..1."""
    if not sorted_values:
        return None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q = {q!r}: must be within 0..1")
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def quantile(values: Iterable[float], q: float) -> float | None:
    """:func:`percentile` of values in any order (sorted here)."""
    return percentile(sorted(values), q)
