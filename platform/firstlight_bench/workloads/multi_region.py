"""W6, multi-region: each region's daily peak in turn, regional prompts.

Arrivals: over one "day" of ``period_s`` (default: the trace's expected duration
``num_requests / rate_rps``, one day compressed into the trace), each of the ``R`` client
regions has its peak in its own slice of the day — region ``r`` in
``[r, r + 1) * period_s / R``, a raised cosine from ``trough`` up to ``peak`` and back —
and sits at ``trough`` the rest of the day:

    f_r(t) = trough + (peak - trough) * (1 - cos(2π (t mod period - r period/R) R / period)) / 2
                                                         [inside region r's slice, else trough]
    rate_r(t) = rate_rps / R * f_r(t) / mean(f)

with ``mean(f) = trough + (peak - trough) / (2R)``, so the mean total rate is
``rate_rps``. With the defaults (1.6 and 0.5) a region at its peak sends 3.2 times what
each of its neighbours sends: when the peak reaches 1.3-2x the region's own capacity,
the neighbours sit at 40-60 % of theirs (the BENCHMARKS.md scenario). Drawn by
Lewis-Shedler thinning: candidates at the peak total rate, each given a uniform region
and kept with probability ``f_r(t) / peak``.

Content: W1's, except that every region has its own ``groups`` system prompts (group
``r * groups + g``), picked uniformly by that region's users.

With the default period the regions (and so the prompts) do not depend on the rate: the
thinning runs in normalized time. An explicit ``period_s`` is a wall-clock period, so the
share of each phase in the trace, and with it the region sequence, then changes with
``rate_rps``. Called through the registry by :func:`firstlight_bench.workloads.generate`.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, model_validator

from firstlight_bench.workloads._model import Trace, TraceShape, assemble
from firstlight_bench.workloads._sampling import stream
from firstlight_bench.workloads.shared_prefix import (
    SharedPrefixParams,
    question_request,
    system_prompts,
)

__all__ = ["MultiRegionParams", "generate_multi_region"]


class MultiRegionParams(SharedPrefixParams):
    """Parameters of W6 (W1's content parameters, per region)."""

    groups: Annotated[int, Field(ge=1, le=100_000)] = 16
    """Number of distinct system prompts *per region*."""
    peak: Annotated[float, Field(gt=0, le=1000)] = 1.6
    """A region's rate at the top of its daily peak, relative to ``trough`` (only the
    ratio of the two matters: the load sets the scale)."""
    trough: Annotated[float, Field(gt=0, le=1000)] = 0.5
    """A region's rate outside its peak; at most ``peak``."""

    @model_validator(mode="after")
    def _trough_below_peak(self) -> MultiRegionParams:
        if self.trough > self.peak:
            raise ValueError(f"trough = {self.trough} is above peak = {self.peak}")
        return self

    period_s: Annotated[float | None, Field(gt=0, le=1e9)] = None
    """Length of one "day" in seconds; ``None``: the trace's expected duration,
    ``num_requests / rate_rps``."""


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


def generate_multi_region(params: MultiRegionParams, shape: TraceShape) -> Trace:
    """W6: each region's daily peak in turn, by thinning; per-region system prompts."""
    if params.period_s is None:
        period_u = float(shape.num_requests)
    else:
        period_u = params.period_s * shape.rate_rps
    arrivals, regions = _thinned_arrivals(shape, params, period_u)
    rng = stream(shape.seed, "content")
    prompts = system_prompts(rng, params.groups * shape.regions, params)
    contents = []
    for region in regions:
        group = region * params.groups + rng.randrange(params.groups)
        contents.append(question_request(rng, prompts[group], group, region, params))
    mean = params.trough + (params.peak - params.trough) / (2 * shape.regions)
    derived = {
        "period_s": period_u / shape.rate_rps,
        "peak_to_mean": params.peak / mean,
        "trough_to_mean": params.trough / mean,
    }
    return Trace(assemble("w6", arrivals, shape.rate_rps, contents), derived)
