"""The ``sim`` engine: a vLLM-faithful simulator, labelled simulated wherever it appears.

For CI without GPUs, capacity planning and routing studies at 64+ replicas. Pieces:

* :mod:`.profiles` — what a step costs on a given model and device (:class:`SimProfile`,
  registered by name in :data:`PROFILES`).
* :class:`SimCore` — one replica's vLLM v1 scheduler (continuous batching under a token
  budget and ``max_num_seqs``, chunked prefill, preemption), KV-cache blocks and
  block-level LRU prefix cache; pure, synchronous, deterministic.
* :class:`SimEngine` — the core behind the :class:`~firstlight.engine.protocol.Engine`
  contract, stepping in real time on asyncio (the ModelServer's ``engine: sim``).
* :class:`VirtualSim` — the core on a virtual clock, for the benchmark's discrete-event
  simulation (no asyncio, no sleeping).
* :class:`TrueCacheView` — the replicas' real cache state as a routing ``CacheView``
  (hints without delay, for tests).
* :class:`SimCacheEvent` — a cache event with the host tier's changes (KV offloading,
  ``SimProfile.host_kv_blocks``), which the protocol's ``CacheEvent`` does not carry.
"""

from firstlight.engine.sim._kv import SimCacheEvent
from firstlight.engine.sim.core import SimCore
from firstlight.engine.sim.engine import SimEngine, Sleep
from firstlight.engine.sim.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    SimProfile,
    get_profile,
    profile_names,
)
from firstlight.engine.sim.results import FinishedRequest, StepResult
from firstlight.engine.sim.true_cache import TrueCacheView
from firstlight.engine.sim.virtual import VirtualSim, VirtualStep

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "FinishedRequest",
    "SimCacheEvent",
    "SimCore",
    "SimEngine",
    "SimProfile",
    "Sleep",
    "StepResult",
    "TrueCacheView",
    "VirtualSim",
    "VirtualStep",
    "get_profile",
    "profile_names",
]
