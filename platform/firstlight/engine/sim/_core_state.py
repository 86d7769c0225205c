"""One simulated replica's state and what is read of it: :class:`CoreState`, the base of
:class:`~firstlight.engine.sim.SimCore`.

The state is what the scheduler (:mod:`firstlight.engine.sim.core`) changes step by step:
the profile and hash scheme, the requests by id, the waiting queue and the running list,
the KV block pool with its prefix cache (and host tier), the step in flight, the cache
events not drained yet and the counters behind :meth:`CoreState.stats`. The methods here
only read it, or take in what arrives from outside the scheduler (cache events to
drain, KV blocks pulled from another site). The drivers
(:class:`~firstlight.engine.sim.SimEngine`, :class:`~firstlight.engine.sim.VirtualSim`),
the routing adapter :class:`~firstlight.engine.sim.TrueCacheView` and the benchmark call
them on a :class:`~firstlight.engine.sim.SimCore`. Pure, synchronous, deterministic,
like the core.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from firstlight.engine._steps import RecentSteps
from firstlight.engine.protocol import CacheEvent, EngineStats
from firstlight.engine.sim._filler import Filler
from firstlight.engine.sim._kv import BlockPool
from firstlight.engine.sim._request import SimRequest
from firstlight.engine.sim.profiles import DEFAULT_PROFILE, SimProfile, get_profile
from firstlight.engine.sim.results import StepResult
from firstlight.prefix import HashScheme

__all__ = ["CoreState"]


class CoreState:
    """The state of one simulated replica and its reads (see the module docstring); built
    from :class:`~firstlight.engine.sim.SimCore`'s arguments, which its docstring gives."""

    def __init__(
        self,
        profile: SimProfile | str = DEFAULT_PROFILE,
        *,
        hash_seed: int = 0,
        seed: int = 0,
        record_events: bool = True,
    ) -> None:
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        self.scheme = HashScheme(self.profile.block_size, hash_seed)
        self.seed = seed
        self._filler = Filler(seed)
        self._pool = BlockPool(
            self.profile.kv_cache_blocks,
            record_events=record_events,
            host_capacity=self.profile.host_kv_blocks,
        )
        self._requests: dict[str, SimRequest] = {}
        self._waiting: deque[SimRequest] = deque()
        self._waiting_count = 0
        self._waiting_unscheduled = 0
        self._running: list[SimRequest] = []
        self._batch: list[tuple[SimRequest, int]] | None = None
        self._step: StepResult | None = None
        self._pending_tokens = 0
        self._queries = 0
        self._hits = 0
        self._events: list[CacheEvent] = []
        self._recent = RecentSteps()
        self.slowdown = 1.0
        """Every step takes this many times the profile's time (a brownout: throttled or
        degraded hardware, a noisy neighbour); set by the benchmark's fleet events. The
        stats report the slower steps, as a real engine's would."""

    def _take_event(self) -> None:
        event = self._pool.take_event()
        if event is not None:
            self._events.append(event)

    # --- observation ---------------------------------------------------------------------

    def text(self, token_id: int) -> str:
        """Text of an output token id (filler: a space and a word)."""
        return self._filler.text(token_id)

    def drain_cache_events(self) -> list[CacheEvent]:
        """Cache changes since the last call, oldest first: evictions when a step is
        scheduled, stores when it finishes, so replaying every event drained so far
        always gives :meth:`cache_contents`."""
        events, self._events = self._events, []
        return events

    def receive_blocks(self, block_hashes: Sequence[int]) -> int:
        """A prefix's KV arrived from another site (the benchmark's KV pull across
        regions): its blocks join the prefix cache unpinned, as :meth:`BlockPool.receive`
        places them, announced in the next cache event. Returns how many leading blocks
        of ``block_hashes`` are cached afterwards; a request added later hits them unless
        they are evicted before it is scheduled."""
        count = self._pool.receive(block_hashes)
        self._take_event()
        return count

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of ``block_hashes`` the cache holds right now (the true
        state, as :class:`TrueCacheView` reads it). Linear in the answer; never raises."""
        return self._pool.longest_prefix(block_hashes, len(block_hashes))

    def host_prefix_blocks(self, block_hashes: Sequence[int], start: int) -> int:
        """How many blocks of ``block_hashes`` from index ``start`` on the host tier holds
        right now (the run a prefix hit after ``start`` device blocks would reload; 0
        without a host tier). Never raises."""
        return self._pool.host_prefix(block_hashes, start, len(block_hashes))

    def cache_contents(self) -> frozenset[int]:
        """Hint hashes of every cached block, pinned or evictable (device tier)."""
        return self._pool.contents()

    def host_contents(self) -> frozenset[int]:
        """Hint hashes of every block held in the host tier (empty without one)."""
        return self._pool.host_contents()

    def is_pinned(self, block_hash: int) -> bool:
        """Whether a running request holds the cached block ``block_hash``."""
        return self._pool.is_pinned(block_hash)

    @property
    def kv_blocks_used(self) -> int:
        """KV blocks held by running requests."""
        return self._pool.used

    @property
    def num_running(self) -> int:
        """Requests admitted and not finished."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued (including preempted ones)."""
        return self._waiting_count

    @property
    def waiting_after_schedule(self) -> int:
        """Requests the last step's scheduling left waiting — what vLLM's
        ``vllm:num_requests_waiting`` gauge shows between steps (its scheduler reports
        stats after each step; requests added during a step are not in it yet)."""
        return self._waiting_unscheduled

    def stats(self) -> EngineStats:
        """Load and cache statistics, every number simulated; rates over the last 16
        prefill and decode steps. O(1): the benchmark calls it per replica per decision."""
        return EngineStats(
            running=len(self._running),
            waiting=self._waiting_count,
            kv_cache_usage=self._pool.used / self._pool.capacity,
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
            pending_prefill_tokens=self._pending_tokens,
            prefill_tokens_per_s=self._recent.prefill_tokens_per_s,
            inter_token_latency_ms=self._recent.inter_token_latency_ms,
            step_ms=self._recent.step_ms,
            kv_cache_blocks=self._pool.capacity,
            simulated=True,
        )
