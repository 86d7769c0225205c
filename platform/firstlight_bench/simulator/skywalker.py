"""SkyWalker's regional load balancer, re-implemented from its published design for the
simulator's ``skywalker`` arm.

Source: SkyWalker (EuroSys '26, arXiv 2505.24095; v1 titled "SkyLB"), code in
``skypilot-org/skypilot``, branch ``serve-multi-region-lb``: ``sky/serve/load_balancer.py``
(``_queue_processor``, ``_probe_ie_queue``, ``_probe_lb_status``),
``sky/serve/load_balancing_policies.py`` (``PrefixTreePolicy``) and
``sky/utils/env_options.py``. The arm runs the configuration of the paper's experiments
(``ENABLE_SELECTIVE_PUSHING``, ``DO_PUSHING_ACROSS_LB``, prefix-tree policies for
replicas and for load balancers; stealing is off in that mode):

* one load balancer (LB) per region, clients reach their own region's; each LB keeps a
  FIFO queue and, every 10 ms, takes the request at its head (one per pass);
* **selective pushing**: a local replica may take it only if its engine's waiting queue
  was empty at the last probe (``vllm:num_requests_waiting``, every 100 ms); nothing marks
  a replica busy between probes;
* the local pick among those: the prefix tree — the replica(s) holding the longest prefix
  of the prompt, the one this LB has fewest requests in flight on; when the matched share
  is 0.5 or less, the least loaded available replica;
* **push across regions** only when no local replica is available, and never a request
  another LB pushed here (a header marks it): a peer LB is eligible when its queue is no
  longer than this LB's and at most 10, and it has an available replica (its ``/conf``,
  probed every 100 ms); among eligible peers the same prefix-tree rule at LB granularity,
  load being the requests this LB forwarded there that have not finished;
* otherwise the request stays at the head of the queue for the next pass.

RTT enters nowhere (the code measures it only to order its stealing, which this mode
does not run). The prefix tree works on characters of the prompt; here on the prompt's
KV blocks, the same share of a shared prefix.

Who calls what: :class:`firstlight_bench.simulator.des._Run` keeps one :class:`SkyLb` per region,
calls :meth:`SkyLb.probe` every :data:`PROBE_S`, :meth:`SkyLb.pick_replica` and
:meth:`SkyLb.pick_peer` on each pass, :meth:`SkyLb.dispatched` /
:meth:`SkyLb.forwarded` after a choice and :meth:`SkyLb.completed` when a request ends
(or its replica is lost). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from firstlight.routing import RequestView
from firstlight.routing.baselines._block_index import BlockIndex

__all__ = ["MAX_PEER_QUEUE", "PASS_S", "PROBE_S", "PeerStatus", "SkyLb"]

PASS_S = 0.01
"""``_QUEUE_PROCESSOR_SLEEP_TIME``: the queue is walked every 10 ms."""
PROBE_S = 0.1
"""``_IE_QUEUE_PROBE_INTERVAL``: replicas' waiting queues and peers' status, every 100 ms."""
MAX_PEER_QUEUE = 10
"""``_STEAL_TRIGGER_THRESHOLD``: a peer with a longer queue takes no pushed request."""
_MATCH_SHARE = 0.5
"""``PrefixTreePolicy``: at or below this matched share, the least loaded instead."""


@dataclass(frozen=True, slots=True)
class PeerStatus:
    """A peer LB as its ``/conf`` answered at the last probe."""

    queue: int
    available_replicas: int


@dataclass(slots=True)
class SkyLb:
    """One region's load balancer: its queue, what its probes saw, its prefix trees."""

    region: int
    index_blocks: int
    """Prefix-tree entries kept per replica (or per peer LB)."""
    queue: deque[str] = field(default_factory=deque)
    """Request ids, oldest first."""
    pushed_in: set[str] = field(default_factory=set)
    """Queued requests another LB pushed here (they are never pushed again)."""
    available: set[str] = field(default_factory=set)
    """Local replicas whose engine had no waiting request at the last probe."""
    peers: dict[int, PeerStatus] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    """Replica, or ``"lb<g>"`` for a peer LB → requests sent there, not finished."""
    sent_to: dict[str, str] = field(default_factory=dict)
    """Request id → where this LB sent it (replica id or ``"lb<g>"``)."""
    tree: BlockIndex = field(init=False)
    peer_tree: BlockIndex = field(init=False)

    def __post_init__(self) -> None:
        self.tree = BlockIndex(self.index_blocks)
        self.peer_tree = BlockIndex(self.index_blocks)

    def enqueue(self, request_id: str, *, pushed: bool) -> None:
        self.queue.append(request_id)
        if pushed:
            self.pushed_in.add(request_id)

    def probe(self, waiting: Mapping[str, int], peers: Mapping[int, PeerStatus]) -> None:
        """The 100 ms probes: each local replica's waiting requests, each peer's status."""
        self.available = {rid for rid, count in waiting.items() if count == 0}
        self.peers = dict(peers)

    def status(self) -> PeerStatus:
        """What this LB's ``/conf`` answers its peers."""
        return PeerStatus(len(self.queue), len(self.available))

    def pick_replica(self, request: RequestView) -> str | None:
        """The local replica for ``request``, or ``None`` when none is available."""
        return _prefix_pick(request, self.tree, sorted(self.available), self.in_flight)

    def pick_peer(self, request: RequestView) -> int | None:
        """The peer LB to push ``request`` to, or ``None`` (it stays at the head)."""
        if request.request_id in self.pushed_in:
            return None
        own = len(self.queue)
        eligible = [
            f"lb{g}"
            for g, peer in sorted(self.peers.items())
            if peer.queue <= own and peer.queue <= MAX_PEER_QUEUE and peer.available_replicas
        ]
        chosen = _prefix_pick(request, self.peer_tree, eligible, self.in_flight)
        return None if chosen is None else int(chosen[2:])

    def dispatched(self, request: RequestView, replica: str) -> None:
        self._sent(request, replica, self.tree)

    def forwarded(self, request: RequestView, peer: int) -> None:
        self._sent(request, f"lb{peer}", self.peer_tree)

    def _sent(self, request: RequestView, to: str, tree: BlockIndex) -> None:
        self.queue.popleft()
        self.pushed_in.discard(request.request_id)
        tree.add(request.block_hashes, to)
        self.in_flight[to] = self.in_flight.get(to, 0) + 1
        self.sent_to[request.request_id] = to

    def completed(self, request_id: str) -> None:
        """The request ended (or was lost with its replica): it leaves the load counts."""
        to = self.sent_to.pop(request_id, None)
        if to is not None:
            self.in_flight[to] -= 1

    def drain(self) -> list[str]:
        """The region went down: its queue, emptied (the clients reconnect elsewhere)."""
        queued = list(self.queue)
        self.queue.clear()
        self.pushed_in.clear()
        self.available = set()
        return queued


def _prefix_pick(
    request: RequestView, tree: BlockIndex, candidates: Sequence[str], load: Mapping[str, int]
) -> str | None:
    """``PrefixTreePolicy`` over ``candidates``: the least loaded of those holding the
    longest matched prefix when its share of the prompt is over 0.5, else the least
    loaded candidate (the first on ties)."""
    if not candidates:
        return None
    blocks = request.block_hashes
    if blocks:
        matched = tree.match(blocks)
        depth = max((matched.get(c, 0) for c in candidates), default=0)
        if depth / len(blocks) > _MATCH_SHARE:
            deepest = [c for c in candidates if matched.get(c, 0) == depth]
            return min(deepest, key=lambda c: load.get(c, 0))
    return min(candidates, key=lambda c: load.get(c, 0))
