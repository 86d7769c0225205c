"""Seeded, replayable workloads W1-W8 for the routing benchmark (``BENCHMARKS.md``).

Who calls what: the benchmark runner calls :func:`generate` (or
:meth:`Workload.with_rate` for the next load point) and hands the :class:`Workload` to
the discrete-event simulator, which replays ``requests`` in virtual time, or to the load
driver, which sends them over HTTP at ``arrival_s``.

=====  ==================================================  ===========================
name   content                                             arrivals
=====  ==================================================  ===========================
W1     ``groups`` shared system prompts + short questions  Poisson
W2     multi-turn sessions, each turn extends the last     Poisson session starts +
                                                           think times in seconds
W3     no sharing, random lengths (the control)            Poisson
W4     W1 with Zipf-hot groups                             Poisson
W5     W1's content                                        Gamma (bursty)
W6     per-region system prompts                           each region's daily peak
                                                           in turn (thinning), one
                                                           day of ``period_s``
W7     the Mooncake conversation trace's prefix blocks     the trace's, scaled
W8     W1's, for a fleet of H100, A100 and L4 regions      Poisson
=====  ==================================================  ===========================

Each workload's module docstring and parameter model document it in full;
``WORKLOADS[name].describe()`` prints the parameters with their defaults.

Determinism: content (prompts, ``max_tokens``, groups, sessions, client regions) and
arrivals come from separate ``random.Random`` streams seeded by SHA-256 of
``(seed, purpose)``. The content depends only on the seed, the parameters,
``num_requests`` and ``regions``, never on ``rate_rps``; arrivals are drawn in
normalized time and divided by the rate, so sweeping the load only rescales
``arrival_s`` (rate 100 gives a trace 10 times shorter than rate 10, request for request).
Two exceptions: an explicit W6 ``period_s`` (see :mod:`.multi_region`), and W2,
whose think times are seconds whatever the load, so its sessions are the same at every
rate but which of their turns make up the trace is not (see :mod:`.multi_turn`).
Consumers that cache per-request data across loads key it by prompt, not request id.
"""

from firstlight_bench.workloads._model import FleetEvent, TraceRequest, Workload, WorkloadParams
from firstlight_bench.workloads._registry import (
    WORKLOADS,
    WorkloadSpec,
    describe,
    generate,
    workload_names,
)
from firstlight_bench.workloads.control import ControlParams
from firstlight_bench.workloads.mooncake import MooncakeParams
from firstlight_bench.workloads.multi_region import MultiRegionParams
from firstlight_bench.workloads.multi_turn import MultiTurnParams
from firstlight_bench.workloads.shared_prefix import (
    BurstyParams,
    SharedPrefixParams,
    ZipfPrefixParams,
)

__all__ = [
    "WORKLOADS",
    "BurstyParams",
    "ControlParams",
    "FleetEvent",
    "MooncakeParams",
    "MultiRegionParams",
    "MultiTurnParams",
    "SharedPrefixParams",
    "TraceRequest",
    "Workload",
    "WorkloadParams",
    "WorkloadSpec",
    "ZipfPrefixParams",
    "describe",
    "generate",
    "workload_names",
]
