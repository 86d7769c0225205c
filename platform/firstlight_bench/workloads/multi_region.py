"""W6, multi-region: a day of staggered regional peaks, an outage and a brownout.

Arrivals: over one "day" of ``period_s`` (default 1,200 s: 24 hours compressed into 20
minutes, an hour in 50 s, so that a region's peak lasts minutes and queues have time to
build), each of the ``R`` client regions has its peak in its own slice of the day —
region ``r`` in ``[r, r + 1) * period_s / R``, a raised cosine from ``trough`` up to
``peak`` and back — and sits at ``trough`` the rest of the day:

    f_r(t) = trough + (peak - trough) * (1 - cos(2π (t mod period - r period/R) R / period)) / 2
                                                         [inside region r's slice, else trough]
    rate_r(t) = rate_rps / R * f_r(t) / mean(f)

with ``mean(f) = trough + (peak - trough) / (2R)``, so the mean total rate is
``rate_rps``. With the defaults (1.6 and 0.5) a region at its peak sends 3.2 times what
each of its neighbours sends, and ``peak_to_mean`` (2.34 with three regions, 2.51 with
four) times the fleet's mean rate over R: at a fleet load of 0.8 of its capacity, a
region at its peak offers about twice what it can serve alone (CROSS-REGION.md, "a day
that presses the regions"). Drawn by Lewis-Shedler thinning: candidates at the peak
total rate, each given a uniform region and kept with probability ``f_r(t) / peak``.

Fleet events, centred on a region's peak (the middle of its slice) in the first day:
an **outage** of ``outage_region`` (every replica gone) for ``outage_hours``, and a
**brownout** of ``brownout_region`` (its replicas ``brownout_slowdown`` times slower)
for ``brownout_hours``; ``None`` turns either off. They travel with the trace as
:class:`~firstlight_bench.workloads.FleetEvent` records for the simulator to apply.

Content: W1's, except that every region has its own ``groups`` system prompts (group
``r * groups + g``), picked uniformly by that region's users.

With ``period_s = None`` the day is the trace's expected duration,
``num_requests / rate_rps``: the thinning runs in normalized time and the regions (and
so the prompts) do not depend on the rate. With a wall-clock period the share of each
phase in the trace, and with it the region sequence, changes with ``rate_rps``; the
benchmark then sizes each load's trace to one day (``rate x period_s`` requests; see
:data:`~firstlight_bench.workloads.WorkloadSpec.day_param`). Called through the registry
by :func:`firstlight_bench.workloads.generate`.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, model_validator

from firstlight.errors import ConfigError, ConfigProblem
from firstlight_bench.workloads._model import FleetEvent, Trace, TraceShape, assemble
from firstlight_bench.workloads._sampling import stream
from firstlight_bench.workloads.shared_prefix import (
    SharedPrefixParams,
    question_request,
    system_prompts,
)

__all__ = ["MultiRegionParams", "generate_multi_region", "hour_of_day"]

HOURS = 24.0


class MultiRegionParams(SharedPrefixParams):
    """Parameters of W6 (W1's content parameters, per region)."""

    groups: Annotated[int, Field(ge=1, le=100_000)] = 16
    """Number of distinct system prompts *per region*."""
    peak: Annotated[float, Field(gt=0, le=1000)] = 1.6
    """A region's rate at the top of its daily peak, relative to ``trough`` (only the
    ratio of the two matters: the load sets the scale)."""
    trough: Annotated[float, Field(gt=0, le=1000)] = 0.5
    """A region's rate outside its peak; at most ``peak``."""
    period_s: Annotated[float | None, Field(gt=0, le=1e9)] = 1200.0
    """Length of one "day" in seconds: 24 hours compressed into 20 minutes by default.
    ``None``: the trace's expected duration, ``num_requests / rate_rps``."""
    outage_region: Annotated[int | None, Field(ge=0, le=999)] = 0
    """The region whose replicas all go down in the middle of its peak; ``None``: none."""
    outage_hours: Annotated[float, Field(gt=0, le=24)] = 1.0
    """How long the outage lasts, in hours of the day."""
    brownout_region: Annotated[int | None, Field(ge=0, le=999)] = 1
    """The region whose replicas run slower in the middle of its peak; ``None``: none."""
    brownout_hours: Annotated[float, Field(gt=0, le=24)] = 2.0
    """How long the brownout lasts, in hours of the day."""
    brownout_slowdown: Annotated[float, Field(ge=1, le=100)] = 3.0
    """How many times slower every engine step of the browned-out region is."""

    @model_validator(mode="after")
    def _trough_below_peak(self) -> MultiRegionParams:
        if self.trough > self.peak:
            raise ValueError(f"trough = {self.trough} is above peak = {self.peak}")
        return self


def hour_of_day(arrival_s: float, period_s: float) -> int:
    """The hour (0-23) of the day an arrival falls in (days repeat every ``period_s``)."""
    return min(int((arrival_s % period_s) / period_s * HOURS), int(HOURS) - 1)


def _level(params: MultiRegionParams, region: int, regions: int, day: float) -> float:
    """``f_r`` at ``day``, the time of day as a fraction of the period."""
    x = (day % 1.0) * regions - region
    if not 0.0 <= x < 1.0:
        return params.trough
    return params.trough + (params.peak - params.trough) * (1 - math.cos(2 * math.pi * x)) / 2


def _thinned_arrivals(
    shape: TraceShape, params: MultiRegionParams, period_u: float
) -> tuple[list[float], list[int]]:
    rng = stream(shape.seed, "arrivals")
    regions = shape.regions
    mean = params.trough + (params.peak - params.trough) / (2 * regions)
    candidate_rate = params.peak / mean  # in normalized time, all regions together
    arrivals: list[float] = []
    client_regions: list[int] = []
    u = 0.0
    while len(arrivals) < shape.num_requests:
        u += rng.expovariate(candidate_rate)
        region = rng.randrange(regions)
        if rng.random() * params.peak < _level(params, region, regions, u / period_u):
            arrivals.append(u)
            client_regions.append(region)
    return arrivals, client_regions


def _events(params: MultiRegionParams, regions: int, period_s: float) -> tuple[FleetEvent, ...]:
    """The outage and the brownout, each centred on its region's peak in the first day.
    Raises :class:`ConfigError` naming the field when a region does not exist."""
    problems = [
        ConfigProblem(f"W6.{name}", f"there are {regions} regions (0..{regions - 1})", value, True)
        for name, value in (
            ("outage_region", params.outage_region),
            ("brownout_region", params.brownout_region),
        )
        if value is not None and value >= regions
    ]
    if problems:
        raise ConfigError(problems)

    def centred(region: int, hours: float) -> tuple[float, float]:
        centre = (region + 0.5) / regions * period_s
        half = hours / HOURS * period_s / 2
        return max(centre - half, 0.0), centre + half

    events = []
    if params.outage_region is not None:
        start, end = centred(params.outage_region, params.outage_hours)
        events.append(FleetEvent("outage", params.outage_region, start, end))
    if params.brownout_region is not None:
        start, end = centred(params.brownout_region, params.brownout_hours)
        events.append(
            FleetEvent("brownout", params.brownout_region, start, end, params.brownout_slowdown)
        )
    return tuple(sorted(events, key=lambda e: e.start_s))


def generate_multi_region(params: MultiRegionParams, shape: TraceShape) -> Trace:
    """W6: each region's daily peak in turn, by thinning; per-region system prompts; the
    outage and the brownout as fleet events."""
    if params.period_s is None:
        period_u = float(shape.num_requests)
    else:
        period_u = params.period_s * shape.rate_rps
    period_s = period_u / shape.rate_rps
    events = _events(params, shape.regions, period_s)
    arrivals, regions = _thinned_arrivals(shape, params, period_u)
    rng = stream(shape.seed, "content")
    prompts = system_prompts(rng, params.groups * shape.regions, params)
    contents = []
    for region in regions:
        group = region * params.groups + rng.randrange(params.groups)
        contents.append(question_request(rng, prompts[group], group, region, params))
    mean = params.trough + (params.peak - params.trough) / (2 * shape.regions)
    derived = {
        "period_s": period_s,
        "peak_to_mean": params.peak / mean,
        "trough_to_mean": params.trough / mean,
    }
    return Trace(assemble("w6", arrivals, shape.rate_rps, contents), derived, events)
