"""Regions: the peer table (RTT probes, summaries, circuit breakers) for spill-over and
fail-over between regional gateways."""

from firstlight.regions.peers import CircuitBreaker, Peer, PeerTable
from firstlight.regions.summary import (
    ForwardedWork,
    HotPrefixes,
    ModelSummary,
    RegionSummary,
    predict_peer_ttft,
)

__all__ = [
    "CircuitBreaker",
    "ForwardedWork",
    "HotPrefixes",
    "ModelSummary",
    "Peer",
    "PeerTable",
    "RegionSummary",
    "predict_peer_ttft",
]
