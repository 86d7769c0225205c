"""The trace types every workload produces, and the base of their parameter models.

:class:`TraceRequest` and :class:`Workload` are the contract between the generators in
this package and their consumers: the discrete-event simulator replays
``Workload.requests`` in virtual time, and the load driver sends them over HTTP at
``arrival_s``. Both treat a workload as immutable data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "FleetEvent",
    "RequestContent",
    "Trace",
    "TraceRequest",
    "TraceShape",
    "Workload",
    "WorkloadParams",
    "assemble",
]


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload trace."""

    request_id: str
    """Unique within the workload, e.g. ``"w1-000123"`` (numbered in arrival order)."""
    arrival_s: float
    """Seconds from the start of the trace; non-decreasing over ``Workload.requests``."""
    client_region: int
    """Index of the region the client is in (0 for single-region workloads)."""
    prompt: tuple[int, ...]
    """Token ids in ``1..vocab_size-1``, already templated: shared prefixes are identical
    token runs."""
    max_tokens: int
    """Output tokens to generate (the simulator generates exactly this many)."""
    prefix_group: int | None
    """Which shared prefix this request starts with (``None``: none); for analysis only."""
    session: int | None = None
    """Multi-turn session id (W2)."""
    turn: int = 0
    """Turn number within ``session``, from 0."""


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """Something that happens to the serving fleet during a trace (W6's outage and
    brownout): the simulator applies it to the region's replicas from ``start_s`` until
    ``end_s``; the live replay states it beside its results."""

    kind: Literal["outage", "brownout"]
    """``outage``: every replica of the region is gone (requests on them are lost to the
    region and must be served elsewhere); ``brownout``: its replicas run ``slowdown``
    times slower."""
    region: int
    start_s: float
    """Seconds from the start of the trace."""
    end_s: float
    slowdown: float = 1.0
    """A brownout's factor on every engine step (1: none)."""


@dataclass(frozen=True, slots=True)
class Workload:
    """A generated trace plus everything needed to generate it again.

    Built by :func:`firstlight_bench.workloads.generate`; read by the simulator and the
    load driver, and recorded (minus the requests) in a run's ``results.json``.
    """

    name: str
    """``"W1"`` .. ``"W6"``."""
    seed: int
    rate_rps: float
    """Mean offered rate the arrivals were drawn for."""
    params: dict[str, Any]
    """Every parameter used, JSON-serializable: the workload's parameter model dumped
    with its defaults, plus ``"derived"``: values computed from the others (e.g. W2's
    session count, W6's period)."""
    requests: tuple[TraceRequest, ...]
    regions: int
    """Number of client regions (``client_region`` is in ``0..regions-1``)."""
    events: tuple[FleetEvent, ...] = ()
    """What happens to the fleet during the trace (W6), in start order."""

    def mean_prompt_tokens(self) -> float:
        """Mean prompt length in tokens over the requests (0 for an empty trace)."""
        if not self.requests:
            return 0.0
        return sum(len(r.prompt) for r in self.requests) / len(self.requests)

    def mean_output_tokens(self) -> float:
        """Mean ``max_tokens`` over the requests (0 for an empty trace)."""
        if not self.requests:
            return 0.0
        return sum(r.max_tokens for r in self.requests) / len(self.requests)

    def duration_s(self) -> float:
        """Arrival time of the last request (0 for an empty trace)."""
        return self.requests[-1].arrival_s if self.requests else 0.0

    def with_rate(self, rate_rps: float) -> Workload:
        """The same content with arrivals drawn for ``rate_rps`` instead.

        Called by the benchmark's load sweep. Equivalent to calling ``generate`` again
        with the recorded seed and parameters and another rate; prompts, ``max_tokens``,
        groups, sessions and client regions stay identical (see the package docstring
        for the one exception, an explicit W6 ``period_s``). Raises
        :class:`~firstlight.errors.ConfigError` for a rate that is not positive.
        """
        # Imported here: the registry imports this module.
        from firstlight_bench.workloads._registry import generate

        params = {k: v for k, v in self.params.items() if k != "derived"}
        return generate(
            self.name,
            seed=self.seed,
            rate_rps=rate_rps,
            num_requests=len(self.requests),
            regions=self.regions,
            **params,
        )


class WorkloadParams(BaseModel):
    """Base of each workload's parameters (the ``**params`` of ``generate``): immutable,
    strict types, no unknown keys, a docstring and bounds on every field."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True
    )


@dataclass(frozen=True, slots=True)
class TraceShape:
    """The arguments of ``generate`` that every workload shares, already validated."""

    seed: int
    rate_rps: float
    num_requests: int
    regions: int


@dataclass(frozen=True, slots=True)
class Trace:
    """What a workload's generator function returns."""

    requests: tuple[TraceRequest, ...]
    derived: dict[str, Any]
    """Values computed from the parameters, recorded under ``params["derived"]``."""
    events: tuple[FleetEvent, ...] = ()
    """What happens to the fleet during the trace (:attr:`Workload.events`)."""


@dataclass(frozen=True, slots=True)
class RequestContent:
    """A request before it has an id and an arrival time: what the content stream draws."""

    client_region: int
    prompt: tuple[int, ...]
    max_tokens: int
    prefix_group: int | None
    session: int | None = None
    turn: int = 0


def assemble(
    prefix: str, arrivals_u: Sequence[float], rate_rps: float, contents: Sequence[RequestContent]
) -> tuple[TraceRequest, ...]:
    """Number ``contents`` (already in arrival order) ``{prefix}-000000``, ... and give
    them their arrival times ``arrivals_u / rate_rps`` (normalized time to seconds).

    Called by every generator as its last step.
    """
    return tuple(
        TraceRequest(
            request_id=f"{prefix}-{i:06d}",
            arrival_s=u / rate_rps,
            client_region=c.client_region,
            prompt=c.prompt,
            max_tokens=c.max_tokens,
            prefix_group=c.prefix_group,
            session=c.session,
            turn=c.turn,
        )
        for i, (u, c) in enumerate(zip(arrivals_u, contents, strict=True))
    )
