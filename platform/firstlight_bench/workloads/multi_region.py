"""W6, multi-region: phase-shifted daily peaks per client region, regional prompts.

Arrivals: client region ``r`` of ``R`` sends at

    rate_r(t) = rate_rps / R * (1 + amplitude * sin(2π t / period_s + 2π r / R))

so every region has one "daily" peak per ``period_s`` (default: the trace's expected
duration ``num_requests / rate_rps``, one day compressed into the trace), region ``r``
peaking at ``t / period_s = 1/4 - r / R`` (mod 1). The phases are evenly spread, so the
sines cancel and the total rate is constant at ``rate_rps``. Drawn by Lewis-Shedler
thinning: candidates at the peak total rate ``rate_rps * (1 + amplitude)``, each given
a uniform region and kept with probability ``rate_r(t) / peak``.

Content: W1's, except that every region has its own ``groups`` system prompts (group
``r * groups + g``), picked uniformly by that region's users.

With the default period, the regions (and so the prompts) do not depend on the rate:
the thinning runs in normalized time. An explicit ``period_s`` is a wall-clock period,
so the share of each phase in the trace, and with it the region sequence, then changes
with ``rate_rps``. Called through the registry by
:func:`firstlight_bench.workloads.generate`.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

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
    amplitude: Annotated[float, Field(ge=0, le=1)] = 0.8
    """Relative swing of each region's rate around its mean (0: flat)."""
    period_s: Annotated[float | None, Field(gt=0, le=1e9)] = None
    """Length of one "day" in seconds; ``None``: the trace's expected duration,
    ``num_requests / rate_rps``."""


def _thinned_arrivals(
    shape: TraceShape, amplitude: float, period_u: float
) -> tuple[list[float], list[int]]:
    rng = stream(shape.seed, "arrivals")
    regions = shape.regions
    peak = 1 + amplitude
    arrivals: list[float] = []
    client_regions: list[int] = []
    u = 0.0
    while len(arrivals) < shape.num_requests:
        u += rng.expovariate(peak)
        region = rng.randrange(regions)
        phase = 2 * math.pi * (u / period_u + region / regions)
        if rng.random() * peak < 1 + amplitude * math.sin(phase):
            arrivals.append(u)
            client_regions.append(region)
    return arrivals, client_regions


def generate_multi_region(params: MultiRegionParams, shape: TraceShape) -> Trace:
    """W6: per-region sinusoidal rates by thinning; per-region system prompts."""
    if params.period_s is None:
        period_u = float(shape.num_requests)
    else:
        period_u = params.period_s * shape.rate_rps
    arrivals, regions = _thinned_arrivals(shape, params.amplitude, period_u)
    rng = stream(shape.seed, "content")
    prompts = system_prompts(rng, params.groups * shape.regions, params)
    contents = []
    for region in regions:
        group = region * params.groups + rng.randrange(params.groups)
        contents.append(question_request(rng, prompts[group], group, region, params))
    derived = {"period_s": period_u / shape.rate_rps}
    return Trace(assemble("w6", arrivals, shape.rate_rps, contents), derived)
