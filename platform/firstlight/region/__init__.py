"""The region core: what a region's gateway and routers share, pure of Ray, FastAPI and
vLLM — so the gateway, the Ray request router and the benchmark's simulator run the same
code (the simulator keeps no copy of it).

* :mod:`firstlight.region.state` — one model's live routing state in one region
  (:class:`RouterState`): replica views, decisions in flight, the request lifecycle
  (dispatched → routed → first token → finished), the cost model's estimate for the
  region decision and the summary peers read.
* :mod:`firstlight.region.ticket` — one request's :class:`Ticket`: its one decision in
  the region, committed as the route, told its first token and its end.
* :mod:`firstlight.region.registry` — the process's router states by deployment (how the
  gateway finds the state of the router Ray built).
* :mod:`firstlight.region.stats` — :class:`ReplicaStats`, what a replica reports to its
  routers, typed, and :func:`with_shared_rates`.
* :mod:`firstlight.region.shared_routes` — :class:`RouteEvent`, what the routers of
  a region's several gateways tell each other about their routes, and its wire form.
* :mod:`firstlight.region.decision` — the region decision (:func:`decide_region`): serve
  here, forward to a peer, or refuse.
* :mod:`firstlight.region.warm` — the warm region priced: recompute a prefix here, send
  the request where it is cached, or pull its KV (the benchmark's simulator only).
"""

from firstlight.region.decision import (
    PeerChoice,
    PeerOption,
    RegionDecision,
    decide_region,
    rank_peers,
)
from firstlight.region.registry import router_state, routers
from firstlight.region.shared_routes import (
    MalformedRoutesError,
    RouteBatch,
    RouteEvent,
    RouteShareStatus,
    decode_routes,
    encode_routes,
)
from firstlight.region.state import Route, RouterState, ServedBy
from firstlight.region.stats import ReplicaStats, with_shared_rates
from firstlight.region.ticket import Ticket

__all__ = [
    "MalformedRoutesError",
    "PeerChoice",
    "PeerOption",
    "RegionDecision",
    "ReplicaStats",
    "Route",
    "RouteBatch",
    "RouteEvent",
    "RouteShareStatus",
    "RouterState",
    "ServedBy",
    "Ticket",
    "decide_region",
    "decode_routes",
    "encode_routes",
    "rank_peers",
    "router_state",
    "routers",
    "with_shared_rates",
]
