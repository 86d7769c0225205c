"""The firstlight policy's affinity penalty counts a prefix copy held in a replica's host
tier (KV offloading) as held: leaving it costs as much as leaving a device-tier copy."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from firstlight.routing import (
    FirstlightParams,
    FirstlightPolicy,
    ReplicaView,
    RequestView,
    RoutingInput,
)
from tests.conftest import FakeClock


class TieredCache:
    """A fake of the tiered cache view: device-tier runs, and host-tier blocks right
    after them."""

    def __init__(self, device: Mapping[str, int], host: Mapping[str, int]) -> None:
        self.device = dict(device)
        self.host = dict(host)

    def longest_prefix(self, block_hashes: Sequence[int]) -> Mapping[str, int]:
        return {r: min(n, len(block_hashes)) for r, n in self.device.items()}

    def host_prefix(
        self, block_hashes: Sequence[int], device: Mapping[str, int]
    ) -> Mapping[str, int]:
        return {r: min(n, len(block_hashes) - device.get(r, 0)) for r, n in self.host.items()}


PARAMS = FirstlightParams(
    prefill_tokens_per_s=1000,  # 1 ms a token
    step_overhead_ms=5,
    decode_ms_per_running_seq=0,
    tie_margin_ms=2,
    kv_full_fraction=1.0,
    affinity_weight=1.0,
)
REQUEST = RequestView("q1", prompt_tokens=640, block_hashes=tuple(range(20)), block_size=32)


def test_host_tier_blocks_count_with_the_device_run_as_the_prefix_held() -> None:
    # "tiered" holds the prompt's first 4 blocks, 2 on device and the next 2 in host
    # memory; "device" holds the same 4 on device; "cold" holds none. Both holders hold
    # the most (4 blocks): no penalty. "cold" pays the copy of 4 blocks (128 tokens at
    # 1 ms, its queue empty) on top of its predicted TTFT.
    idle = {"queue_len": 0, "pending_prefill_tokens": 0}
    replicas = tuple(ReplicaView(r, "us-east", **idle) for r in ("tiered", "device", "cold"))
    cache = TieredCache({"tiered": 2, "device": 4}, {"tiered": 2})
    policy = FirstlightPolicy(PARAMS, rng=random.Random(0), clock=FakeClock())
    decision = policy.choose(RoutingInput(REQUEST, replicas, cache))
    penalties = {}
    for c in decision.ranked:
        assert c.terms is not None
        penalties[c.replica_id] = c.score - c.terms.total_ms
    assert penalties == pytest.approx({"tiered": 0.0, "device": 0.0, "cold": 4 * 32 * 1.0})
    tiered = next(c for c in decision.ranked if c.replica_id == "tiered")
    assert tiered.terms is not None
    assert (tiered.terms.cached_tokens, tiered.terms.host_tokens) == (64, 64)
