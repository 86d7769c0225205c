"""A multi-region day, hour by hour: what each region's clients met and where their
requests went (W6).

Called by ``firstlight bench sim`` (:mod:`firstlight_bench.simulator.sim`) once per arm, seed and
load of a workload with a wall-clock day (``WorkloadSpec.day_param``), with the run's
outcomes; the result is stored in the point as ``day`` and rendered by the report and
the benchmarks page. Pure: outcomes in, JSON-ready dict out.

* ``hours``: per hour of the day and client region — requests, TTFT p90 and p99, the
  share served in another region, the regions that served them, and the bytes that
  crossed regions (a forwarded request's prompt and answer as text, at
  :data:`BYTES_PER_TOKEN`);
* ``peak``: TTFT p50/p90/p99 over each region's clients during its own peak (the middle
  half of its slice of the day, where its rate is above the midpoint of trough and
  peak), pooled over the regions;
* ``events``: per fleet event (outage, brownout), TTFT p50/p90/p99 and the requests
  lost, over the requests its region's clients sent while it lasted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from firstlight.quantiles import percentile
from firstlight_bench.reports.results import Outcome
from firstlight_bench.workloads import FleetEvent
from firstlight_bench.workloads.multi_region import HOURS, hour_of_day

__all__ = ["BYTES_PER_TOKEN", "day_metrics", "in_peak"]

BYTES_PER_TOKEN = 4
"""Bytes of UTF-8 text per token, for what a forwarded request carries (English text
averages about four characters per token with Llama-family tokenizers); the wire
format's framing is left out."""


def in_peak(arrival_s: float, region: int, regions: int, period_s: float) -> bool:
    """Whether ``arrival_s`` falls in the middle half of ``region``'s slice of the day
    (W6's peaks: a raised cosine over the slice, above its midpoint there)."""
    x = (arrival_s % period_s) / period_s * regions - region
    return 0.25 <= x < 0.75


def _quantiles(values: Iterable[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {f"p{q}": percentile(ordered, q / 100) for q in (50, 90, 99)}


def _ttft(outcomes: Sequence[Outcome]) -> list[float]:
    return [v for o in outcomes if (v := o.ttft_ms) is not None]


def day_metrics(
    outcomes: Sequence[Outcome],
    *,
    period_s: float,
    regions: int,
    events: Sequence[FleetEvent] = (),
) -> dict[str, Any]:
    """The ``day`` block of a point (module docstring)."""
    cells: dict[tuple[int, int], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        cells[(hour_of_day(o.arrival_s, period_s), o.client_region)].append(o)
    hours = []
    for (hour, region), group in sorted(cells.items()):
        located = [o for o in group if o.served_region is not None]
        away = [o for o in located if o.served_region != region]
        ttft = sorted(_ttft(group))
        hours.append(
            {
                "hour": hour,
                "region": region,
                "requests": len(group),
                "lost": sum(1 for o in group if o.error is not None),
                "ttft_p90_ms": percentile(ttft, 0.9),
                "ttft_p99_ms": percentile(ttft, 0.99),
                "served_elsewhere": len(away) / len(located) if located else None,
                "served_in": {
                    str(g): n for g, n in sorted(Counter(o.served_region for o in away).items())
                },
                "crossing_bytes": sum(
                    (o.prompt_tokens + o.output_tokens) * BYTES_PER_TOKEN for o in away
                ),
            }
        )
    peak = [o for o in outcomes if in_peak(o.arrival_s, o.client_region, regions, period_s)]
    event_rows = []
    for event in events:
        hit = [
            o
            for o in outcomes
            if o.client_region == event.region and event.start_s <= o.arrival_s < event.end_s
        ]
        event_rows.append(
            {
                "kind": event.kind,
                "region": event.region,
                "start_h": event.start_s / period_s * HOURS,
                "end_h": event.end_s / period_s * HOURS,
                "requests": len(hit),
                "lost": sum(1 for o in hit if o.error is not None),
                "ttft_ms": _quantiles(_ttft(hit)),
            }
        )
    return {
        "period_s": period_s,
        "hours": hours,
        "peak": {"requests": len(peak), "ttft_ms": _quantiles(_ttft(peak))},
        "events": event_rows,
    }
