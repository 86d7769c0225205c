"""The warm region, priced: recompute a prefix here, send the request to the region that
holds it, or pull its KV here.

A request whose prompt prefix a peer region holds (its summary's hot blocks) beyond what
this region's best replica holds has three ways to its first token, each priced by the
cost model's own terms:

* **recompute** — serve it here and prefill what is missing: the local prediction
  (``Decision.winner.predicted_ttft_ms``);
* **forward** — send it to the warm peer: that peer's prediction (:class:`PeerChoice`,
  round trip, its queue and its prefill of what it lacks);
* **pull** — fetch the missing blocks' KV from the warm peer and then serve it here: one
  round trip to ask, the bytes over the WAN at a stated bandwidth, then the local
  prediction less the prefill of the pulled tokens at the local rate. The pull does not
  overlap the local queue (the request joins it when the KV has landed), so the price is
  the two in sequence.

:func:`price_warm` prices the three; :func:`choose_warm` picks between them as the
region decision would: the pull is taken when it beats both serving here and the peer
the decision would spill to, otherwise the decision stands. Pure; called only by the
benchmark's simulator (:mod:`firstlight_bench.simulator.des`) when its cluster states a WAN
bandwidth: the gateway has no KV transport between regions, so the serving path never
pulls (see docs/benchmarks.md, "The warm region").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from firstlight.region.decision import PeerChoice, RegionDecision, local_ms_per_token
from firstlight.routing import Decision, RequestView

__all__ = ["WARM_OPTIONS", "WarmOption", "WarmPrices", "choose_warm", "price_warm", "transfer_ms"]

WarmOption = Literal["recompute", "forward", "pull"]
WARM_OPTIONS: tuple[WarmOption, ...] = ("recompute", "forward", "pull")


@dataclass(frozen=True, slots=True)
class WarmPrices:
    """The three ways to a warm prefix, each a predicted TTFT in ms."""

    peer: str
    """The warm peer: the one holding the longest leading run of the prompt's blocks."""
    pull_tokens: int
    """Tokens whose KV a pull moves (the peer's cached prefix beyond this region's)."""
    pull_bytes: int
    recompute_ms: float
    forward_ms: float
    pull_ms: float


def transfer_ms(tokens: int, kv_bytes_per_token: int, wan_gbps: float) -> float:
    """Moving ``tokens`` tokens' KV over a ``wan_gbps`` Gbit/s link, in ms."""
    return tokens * kv_bytes_per_token * 8 / (wan_gbps * 1e9) * 1000.0


def price_warm(
    request: RequestView,
    local: Decision | None,
    peers: tuple[PeerChoice, ...],
    rtt_ms: dict[str, float],
    *,
    kv_bytes_per_token: int,
    wan_gbps: float,
) -> WarmPrices | None:
    """The three prices for ``request`` (see the module docstring), or ``None`` when it
    is not a warm case: no local prediction, an unknown KV size, or no peer (of
    :func:`~firstlight.region.rank_peers`' ``peers``, with their round trips in
    ``rtt_ms``) holding at least one more leading block than the local winner."""
    if local is None or local.winner.terms is None or kv_bytes_per_token <= 0 or not peers:
        return None
    terms = local.winner.terms
    warm = max(peers, key=lambda p: p.cached_tokens)
    gained = warm.cached_tokens - terms.cached_tokens
    if gained < request.block_size:
        return None
    rate = local_ms_per_token(local) or 0.0
    pull_bytes = gained * kv_bytes_per_token
    pulled_prefill_ms = max(terms.prefill_ms - gained * rate, 0.0)
    pull_ms = (
        rtt_ms.get(warm.region, 0.0)
        + transfer_ms(gained, kv_bytes_per_token, wan_gbps)
        + terms.total_ms
        - terms.prefill_ms
        + pulled_prefill_ms
    )
    return WarmPrices(
        warm.region, gained, pull_bytes, terms.total_ms, warm.predicted_ttft_ms, pull_ms
    )


def choose_warm(prices: WarmPrices, decision: RegionDecision) -> WarmOption | None:
    """What the cost model does with a warm request the region decision placed:
    ``pull`` when the pull's price beats serving here and the spill-over's best peer
    (its ranking, copy penalty included), else what the decision does (``recompute``
    for serving here, ``forward`` for a spill-over). ``None`` for the decision's other
    routes (overflow, fail-over, refusal, a forwarded request): they are not a choice
    between the three."""
    if decision.route == "local":
        return "pull" if prices.pull_ms < prices.recompute_ms else "recompute"
    if decision.route == "spill_over":
        beaten = prices.pull_ms < min(prices.recompute_ms, decision.peers[0].ranking_ms)
        return "pull" if beaten else "forward"
    return None
