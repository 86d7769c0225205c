"""What a routing policy sees: immutable views built by adapters.

The Ray Serve request router, the gateway and the benchmark's simulator each build
these from their own sources (Ray's replica stats, the hint mirror, the simulator's
true state) and hand them to a policy. Policies never reach past them: no Ray, no Redis,
no I/O. Units are in the names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "NO_CACHE",
    "CacheView",
    "ReplicaView",
    "RequestView",
    "RoutingInput",
    "TieredCacheView",
]


@dataclass(frozen=True, slots=True)
class RequestView:
    """A request about to be routed."""

    request_id: str
    prompt_tokens: int
    """Prompt length in tokens after the chat template."""
    block_hashes: tuple[int, ...] = ()
    """Hint-form hashes of the prompt's full blocks, leading block first
    (:func:`firstlight.prefix.hint_hashes`)."""
    block_size: int = 32
    """Tokens per block of ``block_hashes``."""
    client_region: str | None = None
    """Region the request entered through (for RTT); ``None`` means local."""

    @property
    def prompt_blocks(self) -> int:
        """KV blocks the whole prompt fills (the last one partly)."""
        return -(-self.prompt_tokens // max(self.block_size, 1))


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One candidate replica, as its last stats report described it."""

    replica_id: str
    region: str
    queue_len: int
    """Requests on the replica, waiting or running."""
    running: int = 0
    """Requests decoding (a subset of ``queue_len``)."""
    waiting: int = 0
    """Requests the engine holds but has not admitted yet (no KV memory or token budget
    for them), as its last stats reported; the cost model's slot wait counts them."""
    pending_prefill_tokens: int | None = None
    """Prompt tokens admitted but not yet prefilled (uncached work ahead of a new
    request); ``None`` when the replica does not report it."""
    kv_cache_usage: float = 0.0
    """Fraction of KV-cache blocks in use, 0..1."""
    kv_cache_blocks: int | None = None
    """KV-cache capacity in blocks; ``None`` when the replica does not report it (the
    cost model then falls back to a usage threshold)."""
    prefill_tokens_per_s: float | None = None
    """Marginal prefill throughput the engine measured (a step's fixed cost left out);
    ``None`` uses the policy's default."""
    step_ms: float | None = None
    """Duration of a step that only decodes, as the engine measured it: the fixed cost
    the step that emits a first token pays. ``None`` uses the policy's default
    (``step_overhead_ms`` plus ``decode_ms_per_running_seq`` per running sequence)."""
    stats_at: float = 0.0
    """Clock time of the stats snapshot (same clock as the policy's)."""


class CacheView(Protocol):
    """Which replica holds how much of a prompt's prefix.

    Implemented by :class:`firstlight.hints.HintMirror` (announced blocks) and by the
    simulator's :class:`~firstlight.engine.sim.TrueCacheView` (true cache state, in
    tests). Called once per routing decision, so it must be fast and never block.
    """

    def longest_prefix(self, block_hashes: Sequence[int]) -> Mapping[str, int]:
        """Map replica id → number of leading blocks of ``block_hashes`` it holds."""
        ...


class TieredCacheView(CacheView, Protocol):
    """A cache view that also knows the host tier (KV offloading): blocks a replica's
    device evicted to host memory, which a prefix hit reloads instead of recomputing.

    Implemented by :class:`firstlight.hints.HintMirror` and the simulator's
    :class:`~firstlight.engine.sim.TrueCacheView`. The ``firstlight`` policy calls
    :meth:`host_prefix` after :meth:`longest_prefix` when its cache view has it (a view
    without it, such as a test's fake, is taken to know no host tier); the baselines
    read the device tier only.
    """

    def host_prefix(
        self, block_hashes: Sequence[int], device: Mapping[str, int]
    ) -> Mapping[str, int]:
        """Map replica id → number of leading blocks of ``block_hashes`` it holds in its
        host tier right after its ``device`` run (replicas absent from ``device`` start at
        the first block). Empty, and fast, when no replica offloads."""
        ...


class _NoCache:
    def longest_prefix(self, block_hashes: Sequence[int]) -> Mapping[str, int]:
        return {}


NO_CACHE: CacheView = _NoCache()
"""A cache view that knows nothing (hints disabled or not yet bootstrapped)."""


@dataclass(frozen=True, slots=True)
class RoutingInput:
    """Everything one routing decision may use."""

    request: RequestView
    replicas: Sequence[ReplicaView]
    cache: CacheView = NO_CACHE
    rtt_ms: Mapping[str, float] = field(default_factory=dict)
    """Round trip from the client's region to each candidate region; missing → 0."""
