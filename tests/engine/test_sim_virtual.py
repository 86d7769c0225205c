"""VirtualSim (the discrete-event driver), determinism of whole traces, and the true cache
view."""

from __future__ import annotations

import random

import pytest

from firstlight.engine.protocol import GenerationRequest, SamplingSettings
from firstlight.engine.sim import SimCore, SimProfile, TrueCacheView, VirtualSim, VirtualStep
from firstlight.prefix import hint_hashes
from firstlight.routing.views import CacheView

TINY = SimProfile(
    name="tiny",
    description="a small replica for tests",
    step_overhead_ms=10.0,
    prefill_ms_per_token=1.0,
    decode_ms_per_seq=0.5,
    max_num_batched_tokens=64,
    max_num_seqs=4,
    block_size=4,
    kv_cache_blocks=64,
    max_model_len=128,
)


def req(request_id: str, tokens: range | tuple[int, ...], max_tokens: int = 1) -> GenerationRequest:
    return GenerationRequest(request_id, tuple(tokens), SamplingSettings(max_tokens=max_tokens))


def test_an_idle_replica_starts_a_step_when_a_request_arrives() -> None:
    sim = VirtualSim(SimCore(TINY), start_s=5.0)
    assert sim.next_event_s() is None
    assert sim.advance_to(7.0) == []
    assert sim.now_s == 7.0
    sim.add(req("a", range(20), max_tokens=3))
    assert sim.next_event_s() == pytest.approx(7.0 + 0.030)  # 10 ms + 20 tokens
    (step,) = sim.advance_to(7.031)
    assert step.start_s == 7.0
    assert step.end_s == pytest.approx(7.030)
    assert step.result.first_token_ids == ["a"]
    steps = sim.run_until_idle()
    assert [s.result.decode_seqs for s in steps] == [1, 1]
    assert sim.now_s == pytest.approx(7.0 + 0.030 + 2 * 0.0105)
    assert sim.next_event_s() is None


def test_a_request_arriving_mid_step_waits_for_the_next_step() -> None:
    sim = VirtualSim(SimCore(TINY))
    sim.add(req("a", range(40)))  # step 1: 50 ms
    sim.advance_to(0.010)
    sim.add(req("b", range(100, 110)))
    first, second = sim.run_until_idle()
    assert first.result.first_token_ids == ["a"]
    assert second.result.first_token_ids == ["b"]
    assert second.start_s == pytest.approx(0.050)
    assert second.end_s == pytest.approx(0.050 + 0.020)


def test_time_never_goes_backwards() -> None:
    sim = VirtualSim(SimCore(TINY))
    sim.advance_to(1.0)
    with pytest.raises(ValueError, match="back in time"):
        sim.advance_to(0.5)


def test_run_until_idle_stops_at_the_limit() -> None:
    sim = VirtualSim(SimCore(TINY))
    sim.add(req("a", range(20), max_tokens=10))
    steps = sim.run_until_idle(limit_s=0.05)
    assert steps[-1].end_s <= 0.05
    assert sim.next_event_s() is not None
    assert sim.core.has_work


def trace(seed: int, profile: SimProfile | str = "h100-llama-8b") -> list[tuple[object, ...]]:
    """A seeded random workload on 3 replicas; the full trace of every step."""
    rng = random.Random(1234)
    sims = [VirtualSim(SimCore(profile, seed=seed)) for _ in range(3)]
    prefixes = [tuple(rng.randrange(50_000) for _ in range(512)) for _ in range(4)]
    out: list[tuple[object, ...]] = []
    now_s = 0.0

    def record(replica: int, steps: list[VirtualStep]) -> None:
        for s in steps:
            r = s.result
            finished = [(f.request_id, f.finish_reason, f.usage) for f in r.finished]
            out.append((replica, s.start_s, s.end_s, tuple(r.tokens), tuple(finished)))

    for i in range(120):
        now_s += rng.expovariate(40.0)
        for replica, sim in enumerate(sims):
            record(replica, sim.advance_to(now_s))
        tokens = rng.choice(prefixes)[: rng.randrange(16, 512)] + tuple(
            rng.randrange(50_000) for _ in range(rng.randrange(1, 200))
        )
        sims[i % 3].add(req(f"q{i}", tokens, max_tokens=rng.randrange(1, 60)))
    for replica, sim in enumerate(sims):
        record(replica, sim.run_until_idle())
    return out


def test_the_same_seed_gives_the_same_trace_tokens_and_timings() -> None:
    first, again = trace(seed=7), trace(seed=7)
    assert first == again
    other = trace(seed=8)
    assert [t[:3] for t in other] == [t[:3] for t in first]  # same timings ...
    assert [t[3] for t in other] != [t[3] for t in first]  # ... other filler tokens


def test_the_true_cache_view_reports_each_replicas_cached_prefix() -> None:
    cores = {"a": SimCore(TINY), "b": SimCore(TINY), "c": SimCore(TINY)}
    shared = tuple(range(40))  # 10 blocks
    for name, length in (("a", 40), ("b", 17)):
        sim = VirtualSim(cores[name])
        sim.add(req(f"warm-{name}", shared[:length]))
        sim.run_until_idle()
    view: CacheView = TrueCacheView(cores)
    blocks = hint_hashes(shared + (999,) * 8, cores["a"].scheme)
    assert view.longest_prefix(blocks) == {"a": 10, "b": 4}
    assert view.longest_prefix(()) == {}
    assert view.longest_prefix(hint_hashes(tuple(range(500, 540)), cores["a"].scheme)) == {}
