"""The cross-region routers users would run instead of Firstlight's region decision,
re-implemented from their published designs (``CROSS-REGION.md`` of the design notes has
the sources): how each picks the region a request is served in.

Who calls what: the simulator (:mod:`firstlight_bench.simulator.des`) calls :func:`waterfall` and
:func:`global_pool` per arrival with :class:`RegionLoad` snapshots it refreshes at each
probe interval (what a multicluster gateway scrapes), and keeps one :class:`Gorgo` per run
(GORGO's central proxy, which picks the replica itself). The in-region choice after
``waterfall`` and ``global_pool`` is the arm's in-region policy
(:data:`firstlight_bench.simulator.cluster.ARMS`). Pure: no clock, no I/O.

* ``waterfall`` — GKE multi-cluster Gateway, ``WATERFALL_BY_REGION`` (its default): the
  nearest healthy region while its recent rate stays under ``maxRatePerEndpoint x
  endpoints``; only the excess goes on to the next nearest. Envoy and Istio priority
  fail-over is the same minus the capacity overflow (it moves traffic only on failures):
  the ``local`` arms, which fail over to the nearest healthy region, stand for it.
* ``global_pool`` — llm-d Router v0.10 multicluster plugins (alpha; llm-d/llm-d#2380): the
  cluster-scoped picker scores each peer cluster by ``multicluster-queue-scorer``
  ``(maxQ - q) / (maxQ - minQ)``, ``multicluster-kv-cache-utilization-scorer`` ``1 - util``
  and ``multicluster-prefix-cache-scorer`` (the share of the prompt's leading blocks the
  cluster served recently), weights 1.0, highest total wins. **No RTT term.**
* ``gorgo`` — GORGO (arXiv 2602.11688; ``Arcadia-Research-Team/GORGO``,
  ``gorgo/policy/gorgo.py``): one proxy over every replica of every region,
  ``score = w_rtt x RTT_ms + uncached_tokens + w_queue x queued_tokens``, argmin, with its
  frozen weights ``w_rtt = 0.276``, ``w_queue = 0.5``; uncached tokens from its own index
  of what it dispatched where, queued tokens the prompt tokens it dispatched that have
  not completed. The simulator gives every client region a copy of the one proxy's state
  (no extra hop to a central site: a simplification in GORGO's favour).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from firstlight.regions.summary import leading_blocks
from firstlight.routing import RequestView
from firstlight.routing.baselines._block_index import BlockIndex

__all__ = [
    "GORGO_W_QUEUE",
    "GORGO_W_RTT",
    "Gorgo",
    "RateWindow",
    "RegionLoad",
    "WaterfallBalancer",
    "global_pool",
    "nearest_first",
    "waterfall",
]

GORGO_W_RTT = 0.276
"""GORGO's frozen RTT weight (tokens per millisecond of round trip)."""
GORGO_W_QUEUE = 0.5
"""GORGO's frozen queue weight."""
_WINDOW_S = 1.0
"""The waterfall's rate window: the rate a region is taking, over the last second."""


@dataclass(frozen=True, slots=True)
class RegionLoad:
    """One region as a multicluster gateway sees it at its last scrape."""

    index: int
    up: bool
    """Whether it has a healthy replica (health checks)."""
    replicas: int
    mean_waiting: float
    """Mean waiting requests per replica (``vllm:num_requests_waiting``)."""
    kv_utilisation: float
    """Mean KV-cache usage over its replicas, 0-1."""
    hot_blocks: frozenset[int] = frozenset()
    """Prompt blocks the region served recently (its summary's hot prefixes)."""


class RateWindow:
    """Requests a region took over the last second (the waterfall's rate signal)."""

    __slots__ = ("_times",)

    def __init__(self) -> None:
        self._times: deque[float] = deque()

    def add(self, now: float) -> None:
        self._times.append(now)

    def rate(self, now: float) -> float:
        """Requests per second over the window ending at ``now``."""
        times = self._times
        while times and times[0] <= now - _WINDOW_S:
            times.popleft()
        return len(times) / _WINDOW_S


def nearest_first(rtt_ms: Sequence[float], home: int) -> list[int]:
    """Every region, ``home`` first, then by round trip from it (``rtt_ms[g]``; ties by
    index): the order latency DNS and the waterfall try them in."""
    return sorted(range(len(rtt_ms)), key=lambda g: (rtt_ms[g], g != home, g))


def waterfall(
    by_distance: Sequence[int],
    loads: Sequence[RegionLoad],
    rates: Sequence[float],
    max_rate_per_replica: float,
) -> int | None:
    """The region GKE's ``WATERFALL_BY_REGION`` sends the next request to: the first of
    ``by_distance`` (the client's region first, then by RTT) that is up and whose rate
    ``rates[g]`` is under its capacity (``max_rate_per_replica x replicas``); when all are
    full, the nearest that is up. ``None``: no region is up."""
    up = [g for g in by_distance if loads[g].up]
    for g in up:
        if rates[g] < max_rate_per_replica * loads[g].replicas:
            return g
    return up[0] if up else None


class WaterfallBalancer:
    """GKE's global load balancer in front of the live platform's regions
    (``firstlight bench live --arms waterfall``): :func:`waterfall` over the requests each
    region took in the last second, every region up (the live day has no outage).

    Called by the live load driver (:mod:`firstlight_bench.clients.driver`) once per request as
    it sends it; the returned round trip is what the driver's emulated WAN adds for a
    request served outside its client's region (the simulator's forward costs the
    same)."""

    def __init__(
        self,
        rtt_ms: Sequence[Sequence[float]],
        replicas: Sequence[int],
        max_rate_per_replica: float,
    ) -> None:
        """``rtt_ms[a][b]``: the round trip between regions ``a`` and ``b``;
        ``replicas[g]``: region ``g``'s replicas. Raises ``ValueError`` for a matrix that
        is not square over the regions or a rate that is not positive."""
        count = len(replicas)
        if len(rtt_ms) != count or any(len(row) != count for row in rtt_ms):
            raise ValueError(f"rtt_ms: a {count} x {count} matrix is needed")
        if not max_rate_per_replica > 0:
            raise ValueError(f"max_rate_per_replica = {max_rate_per_replica!r}: must be > 0")
        self._rtt_ms = [list(row) for row in rtt_ms]
        self._loads = [RegionLoad(g, True, replicas[g], 0.0, 0.0) for g in range(count)]
        self._by_distance = [nearest_first(row, a) for a, row in enumerate(self._rtt_ms)]
        self._rates = [RateWindow() for _ in range(count)]
        self._max_rate = max_rate_per_replica

    def choose(self, client_region: int, now_s: float) -> tuple[int, float]:
        """The region that serves the next request of ``client_region``'s clients, sent
        at ``now_s``, and the round trip to it in ms (0 for the client's own region)."""
        rates = [window.rate(now_s) for window in self._rates]
        target = waterfall(self._by_distance[client_region], self._loads, rates, self._max_rate)
        assert target is not None  # every region is up
        self._rates[target].add(now_s)
        return target, self._rtt_ms[client_region][target]


def _hot_share(request: RequestView, hot: frozenset[int]) -> float:
    """The share of the prompt's leading blocks in ``hot`` (0 with no blocks)."""
    if not request.block_hashes or not hot:
        return 0.0
    return leading_blocks(request.block_hashes, hot) / len(request.block_hashes)


def global_pool(request: RequestView, loads: Sequence[RegionLoad]) -> int | None:
    """The region llm-d's multicluster picker chooses: the highest sum of its queue, KV
    and prefix scores over the regions that are up (ties: the first in ``loads``, which
    the caller orders with the client's region first). ``None``: none is up."""
    up = [load for load in loads if load.up]
    if not up:
        return None
    queues = [load.mean_waiting for load in up]
    low, high = min(queues), max(queues)
    best, best_score = None, -1.0
    for load in up:
        queue = 1.0 if high == low else (high - load.mean_waiting) / (high - low)
        kv = 1.0 - min(max(load.kv_utilisation, 0.0), 1.0)
        score = queue + kv + _hot_share(request, load.hot_blocks)
        if score > best_score:
            best, best_score = load.index, score
    return best


class Gorgo:
    """GORGO's proxy state over every replica: what it dispatched where (prefix index)
    and the prompt tokens still queued on each replica. :meth:`choose` per request,
    :meth:`dispatched` once the request is sent, :meth:`completed` when it ends."""

    def __init__(self, index_blocks_per_replica: int) -> None:
        self._index = BlockIndex(index_blocks_per_replica)
        self._queued: dict[str, int] = {}
        self._of: dict[str, tuple[str, int]] = {}

    def choose(
        self,
        request: RequestView,
        candidates: Sequence[tuple[str, float]],
    ) -> str | None:
        """The replica with the lowest score among ``candidates`` (replica id, RTT from the
        client in ms; the client's region first, so ties stay near); ``None`` if empty."""
        matched = self._index.match(request.block_hashes) if request.block_hashes else {}
        best, best_score = None, float("inf")
        for replica, rtt_ms in candidates:
            cached = matched.get(replica, 0) * request.block_size
            uncached = max(request.prompt_tokens - cached, 0)
            score = GORGO_W_RTT * rtt_ms + uncached + GORGO_W_QUEUE * self._queued.get(replica, 0)
            if score < best_score:
                best, best_score = replica, score
        return best

    def dispatched(self, request: RequestView, replica: str) -> None:
        self._index.add(request.block_hashes, replica)
        self._queued[replica] = self._queued.get(replica, 0) + request.prompt_tokens
        self._of[request.request_id] = (replica, request.prompt_tokens)

    def completed(self, request_id: str) -> None:
        """The request ended (or was lost with its replica): its tokens leave the queue."""
        entry = self._of.pop(request_id, None)
        if entry is not None:
            replica, tokens = entry
            self._queued[replica] -= tokens
