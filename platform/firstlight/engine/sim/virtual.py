"""The virtual-clock driver: one simulated replica in a discrete-event simulation.

No asyncio and no sleeping: time is a float the caller moves forward. The benchmark's
event loop keeps many :class:`VirtualSim` replicas in one process and always advances
to the earliest of the next arrival and every replica's :meth:`VirtualSim.next_event_s`::

    sim = VirtualSim(SimCore("h100-llama-8b"))
    for arrival_s, request in workload:
        for step in sim.advance_to(arrival_s):      # steps that ended by then
            record(step.end_s, step.result)
        sim.add(request)                           # arrives at sim.now_s
    steps = sim.run_until_idle()

Steps run back to back while there is work; an idle replica starts a step the moment a
request arrives. A request that arrives during a step waits for the next one, as in
vLLM's engine loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from firstlight.engine.protocol import GenerationRequest
from firstlight.engine.sim.core import SimCore
from firstlight.engine.sim.results import FinishedRequest, StepResult

__all__ = ["VirtualSim", "VirtualStep"]


class VirtualStep(NamedTuple):
    """A completed step on the virtual clock."""

    start_s: float
    end_s: float
    result: StepResult


class VirtualSim:
    """Drives a :class:`SimCore` on a virtual clock starting at ``start_s`` seconds."""

    __slots__ = ("_core", "_end_s", "_now_s", "_start_s")

    def __init__(self, core: SimCore, *, start_s: float = 0.0) -> None:
        self._core = core
        self._now_s = start_s
        self._start_s = start_s
        self._end_s: float | None = None

    @property
    def core(self) -> SimCore:
        """The simulated replica (stats, true cache state, cache events)."""
        return self._core

    @property
    def now_s(self) -> float:
        """The replica's virtual time."""
        return self._now_s

    def next_event_s(self) -> float | None:
        """When the in-flight step ends, or ``None`` when the replica is idle."""
        return self._end_s

    def add(self, request: GenerationRequest, *, block_hashes: Sequence[int] | None = None) -> None:
        """``request`` arrives now (:attr:`now_s`); call :meth:`advance_to` its arrival
        time first. Raises what :meth:`SimCore.add` raises."""
        self._core.add(request, block_hashes=block_hashes)
        if self._end_s is None:
            self._begin()

    def abort(self, request_id: str) -> FinishedRequest | None:
        """Abort now; see :meth:`SimCore.abort`."""
        return self._core.abort(request_id)

    def advance_to(self, t_s: float) -> list[VirtualStep]:
        """Run every step that ends at or before ``t_s`` and move the clock to ``t_s``.

        Raises ``ValueError`` when ``t_s`` is in the past.
        """
        if t_s < self._now_s:
            raise ValueError(f"cannot go back in time: now {self._now_s} s, asked {t_s} s")
        steps: list[VirtualStep] = []
        core = self._core
        while self._end_s is not None and self._end_s <= t_s:
            end_s = self._end_s
            steps.append(VirtualStep(self._start_s, end_s, core.finish_step()))
            self._now_s = end_s
            self._begin()
        self._now_s = t_s
        return steps

    def run_until_idle(self, *, limit_s: float = math.inf) -> list[VirtualStep]:
        """Run steps until no work is left (or the clock would pass ``limit_s``); the
        clock stops at the end of the last step."""
        steps: list[VirtualStep] = []
        core = self._core
        while self._end_s is not None and self._end_s <= limit_s:
            end_s = self._end_s
            steps.append(VirtualStep(self._start_s, end_s, core.finish_step()))
            self._now_s = end_s
            self._begin()
        return steps

    def _begin(self) -> None:
        duration_s = self._core.begin_step()
        if duration_s is None:
            self._end_s = None
        else:
            self._start_s = self._now_s
            self._end_s = self._now_s + duration_s
