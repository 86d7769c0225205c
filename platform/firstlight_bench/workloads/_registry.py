"""The explicit registry of workloads, and :func:`generate`, the one way to build one.

Who calls what: the benchmark runner calls :func:`generate` once per (workload, load
point) — or :meth:`Workload.with_rate` on the first one — and hands the trace to the
simulator or the load driver; the CLI lists :func:`workload_names` and prints
:meth:`WorkloadSpec.describe`. Adding a workload means adding one :class:`WorkloadSpec`
to ``_SPECS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from firstlight.config import validation_problems
from firstlight.errors import ConfigError, ConfigProblem
from firstlight_bench.workloads._model import Trace, TraceShape, Workload, WorkloadParams
from firstlight_bench.workloads.control import ControlParams, generate_control
from firstlight_bench.workloads.mooncake import MooncakeParams, generate_mooncake
from firstlight_bench.workloads.multi_region import MultiRegionParams, generate_multi_region
from firstlight_bench.workloads.multi_turn import MultiTurnParams, generate_multi_turn
from firstlight_bench.workloads.shared_prefix import (
    MIXED_FLEET,
    BurstyParams,
    SharedPrefixParams,
    ZipfPrefixParams,
    generate_bursty,
    generate_mixed_fleet,
    generate_shared_prefix,
    generate_zipf_prefix,
)

__all__ = ["WORKLOADS", "WorkloadSpec", "describe", "generate", "workload_names"]

_MAX_REQUESTS = 10_000_000
_MAX_REGIONS = 1_000


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """One registered workload."""

    name: str
    summary: str
    """One line: what the workload is and what it tests."""
    params: type[WorkloadParams]
    """Its parameter model; field docstrings document each parameter."""
    generator: Callable[[Any, TraceShape], Trace]
    """Builds the trace from validated parameters; called only by :func:`generate`."""
    default_regions: int = 1
    """Client regions when ``generate`` is not given ``regions``."""
    min_regions: int = 1
    fleet: str | None = None
    """The simulated fleet it is meant for (a ``firstlight_bench.simulator.cluster.parse_fleet``
    text): the benchmark's default for it; ``None``: a uniform fleet."""
    capacity_arm: str = "least_queue"
    """The arm whose sustainable rate is the benchmark's load 1.0: cache-blind
    (``least_queue``) by default; W6 measures against a prefix-aware one, so that a
    region's peak presses routers that reuse prefixes too."""
    capacity_params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Parameter overrides for the trace the capacity is measured on (W6: a flat day
    with no fleet events, every region at its mean rate)."""
    day_param: str | None = None
    """The parameter holding the trace's wall-clock day in seconds (W6: ``period_s``):
    the benchmark then gives each load one day of requests (``rate x day``), and
    ``--requests`` sizes only the capacity probe. ``None``: a fixed request count."""

    def describe(self) -> str:
        """The summary plus one line per parameter: name, default, docstring."""
        lines = [f"{self.name}: {self.summary}"]
        for field_name, info in self.params.model_fields.items():
            doc = " ".join((info.description or "").split())
            lines.append(f"  {field_name} = {info.default!r}: {doc}")
        return "\n".join(lines)


_SPECS: tuple[WorkloadSpec, ...] = (
    WorkloadSpec(
        "W1",
        "shared prefix: groups of long system prompts + short questions, Poisson",
        SharedPrefixParams,
        generate_shared_prefix,
    ),
    WorkloadSpec(
        "W2",
        "multi-turn chat: each turn replays the session's history, Poisson sessions",
        MultiTurnParams,
        generate_multi_turn,
    ),
    WorkloadSpec(
        "W3",
        "control: no shared prefixes, random prompt and output lengths, Poisson",
        ControlParams,
        generate_control,
    ),
    WorkloadSpec(
        "W4",
        "hot prefixes: W1 with Zipf-distributed group popularity, Poisson",
        ZipfPrefixParams,
        generate_zipf_prefix,
    ),
    WorkloadSpec(
        "W5",
        "bursty: W1's content with Gamma inter-arrival times (CV = 1/sqrt(burstiness))",
        BurstyParams,
        generate_bursty,
    ),
    WorkloadSpec(
        "W6",
        "multi-region: a day of each region's peak in turn (3.2x its neighbours'), an outage"
        " and a brownout inside peaks, regional prompts; load 1.0 is prefix-aware capacity",
        MultiRegionParams,
        generate_multi_region,
        default_regions=4,
        min_regions=2,
        capacity_arm="cache_aware",
        capacity_params=MappingProxyType(
            {"peak": 1.0, "trough": 1.0, "outage_region": None, "brownout_region": None}
        ),
        day_param="period_s",
    ),
    WorkloadSpec(
        "W7",
        "a real production trace: Mooncake FAST'25 conversations (--param trace=PATH),"
        " its own arrivals scaled to the load",
        MooncakeParams,
        generate_mooncake,
    ),
    WorkloadSpec(
        "W8",
        "mixed fleet: W1's content on regions of H100, A100 and L4 replicas (estimated"
        " profiles of an 8B model)",
        SharedPrefixParams,
        generate_mixed_fleet,
        default_regions=4,
        min_regions=4,
        fleet=MIXED_FLEET,
    ),
)

WORKLOADS: Mapping[str, WorkloadSpec] = {spec.name: spec for spec in _SPECS}
"""Every workload by name, ``"W1"`` .. ``"W8"``."""


def workload_names() -> tuple[str, ...]:
    """Names of the registered workloads, in order."""
    return tuple(WORKLOADS)


def describe(name: str) -> str:
    """:meth:`WorkloadSpec.describe` of workload ``name``; raises :class:`ConfigError`
    for an unknown name."""
    return _spec(name).describe()


def _spec(name: str) -> WorkloadSpec:
    spec = WORKLOADS.get(name) if isinstance(name, str) else None
    if spec is None:
        known = ", ".join(WORKLOADS)
        raise ConfigError(
            [ConfigProblem("workload", f"unknown workload; known: {known}", name, True)]
        )
    return spec


def _int_in(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _shape_problems(
    spec: WorkloadSpec, seed: object, rate_rps: object, num_requests: object, regions: object
) -> list[ConfigProblem]:
    problems = []
    if not isinstance(seed, int) or isinstance(seed, bool):
        problems.append(ConfigProblem("seed", "must be an integer", seed, True))
    if not (
        isinstance(rate_rps, int | float)
        and not isinstance(rate_rps, bool)
        and math.isfinite(rate_rps)
        and rate_rps > 0
    ):
        problems.append(ConfigProblem("rate_rps", "must be a finite number > 0", rate_rps, True))
    if not _int_in(num_requests, 1, _MAX_REQUESTS):
        message = f"must be an integer in 1..{_MAX_REQUESTS}"
        problems.append(ConfigProblem("num_requests", message, num_requests, True))
    if not _int_in(regions, spec.min_regions, _MAX_REGIONS):
        message = f"{spec.name} needs an integer in {spec.min_regions}..{_MAX_REGIONS}"
        problems.append(ConfigProblem("regions", message, regions, True))
    return problems


def generate(
    name: str,
    *,
    seed: int,
    rate_rps: float,
    num_requests: int,
    regions: int | None = None,
    **params: Any,
) -> Workload:
    """Generate workload ``name``: ``num_requests`` requests arriving at ``rate_rps`` on
    average from ``regions`` client regions (``None``: 1, or 4 for W6).

    ``params`` are the workload's parameters (see ``WORKLOADS[name].describe()``);
    omitted ones take their defaults. The same name, seed, ``num_requests``, regions and
    params give identical requests; the content never depends on ``rate_rps``.

    Called by the benchmark runner per load point. Raises :class:`ConfigError` listing
    every problem: unknown name, unknown parameter, wrong type or out-of-range value
    (paths ``seed``, ``rate_rps``, ``num_requests``, ``regions``, ``W1.groups``, ...).
    """
    spec = _spec(name)
    resolved_regions = spec.default_regions if regions is None else regions
    problems = _shape_problems(spec, seed, rate_rps, num_requests, resolved_regions)
    try:
        validated = spec.params.model_validate(params)
    except ValidationError as exc:
        problems.extend(validation_problems(exc, prefix=spec.name))
    if problems:
        raise ConfigError(problems)
    shape = TraceShape(seed, float(rate_rps), num_requests, resolved_regions)
    trace = spec.generator(validated, shape)
    return Workload(
        name=spec.name,
        seed=seed,
        rate_rps=float(rate_rps),
        params={**validated.model_dump(mode="json"), "derived": trace.derived},
        requests=trace.requests,
        regions=resolved_regions,
        events=trace.events,
    )
