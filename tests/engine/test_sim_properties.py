"""SimCore invariants under hypothesis: random profiles (with and without a KV host tier),
arrivals, shared prefixes, salts and aborts. The token budget, max_num_seqs and KV
capacity (both tiers) always hold; cache events replay to the true contents of each
tier; every request gets exactly its tokens."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from firstlight.engine.protocol import GenerationRequest, SamplingSettings
from firstlight.engine.sim import SimCacheEvent, SimCore, SimProfile, VirtualSim, VirtualStep


@dataclass(frozen=True)
class Arrival:
    gap_ms: int
    prefix: int | None
    prompt_len: int
    max_tokens: int
    salt: str | None
    abort_earlier: int | None
    """Index of an earlier request to abort when this one arrives."""


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[SimProfile, list[Arrival]]:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = draw(st.integers(8, 48))
    min_blocks = -(-max_model_len // block_size)
    profile = SimProfile(
        name="hypothesis",
        description="random small replica",
        step_overhead_ms=draw(st.sampled_from([1.0, 5.0])),
        prefill_ms_per_token=draw(st.sampled_from([0.1, 1.0])),
        prefill_ms_per_token_per_context=draw(st.sampled_from([0.0, 0.01])),
        decode_ms_per_seq=0.5,
        max_num_batched_tokens=draw(st.integers(1, 40)),
        max_num_seqs=draw(st.integers(1, 6)),
        block_size=block_size,
        kv_cache_blocks=draw(st.integers(min_blocks, min_blocks + 24)),
        max_model_len=max_model_len,
        host_kv_blocks=draw(st.sampled_from([0, 0, 2, 12])),
        reload_ms_per_token=0.05,
    )
    arrivals = []
    for i in range(draw(st.integers(1, 14))):
        prompt_len = draw(st.integers(1, max_model_len - 1))
        arrivals.append(
            Arrival(
                gap_ms=draw(st.integers(0, 40)),
                prefix=draw(st.none() | st.integers(0, 2)),
                prompt_len=prompt_len,
                max_tokens=draw(st.integers(1, min(8, max_model_len - prompt_len))),
                salt=draw(st.none() | st.just("tenant")),
                abort_earlier=draw(st.none() | st.integers(0, i - 1)) if i else None,
            )
        )
    return profile, arrivals


def prompt(index: int, arrival: Arrival) -> tuple[int, ...]:
    if arrival.prefix is None:
        return tuple(range(100_000 * (index + 1), 100_000 * (index + 1) + arrival.prompt_len))
    return tuple(range(1000 * arrival.prefix, 1000 * arrival.prefix + arrival.prompt_len))


class Checker:
    """Checks each step as it completes and follows every request's output."""

    def __init__(self, core: SimCore) -> None:
        self.core = core
        self.mirror: set[int] = set()
        self.host: set[int] = set()
        self.tokens: dict[str, int] = {}
        self.first: set[str] = set()
        self.finished: dict[str, tuple[str, int]] = {}

    def check(self, steps: list[VirtualStep]) -> None:
        profile, core = self.core.profile, self.core
        for step in steps:
            result = step.result
            assert result.scheduled_tokens <= profile.max_num_batched_tokens
            assert result.scheduled_tokens == result.prefill_tokens + result.decode_seqs
            assert 0 < result.scheduled_seqs <= profile.max_num_seqs
            expected_s = (
                profile.step_ms(result.prefill_tokens, result.decode_seqs, result.prefill_context)
                / 1000
            )
            # A step that reloads host-tier blocks also takes their reload time: whole
            # blocks at the stated rate.
            reload_s = step.end_s - step.start_s - expected_s
            per_block_s = profile.block_size * profile.reload_ms_per_token / 1000
            assert reload_s > -1e-9
            assert abs(reload_s - round(reload_s / per_block_s) * per_block_s) < 1e-9
            if not profile.host_kv_blocks:
                assert abs(reload_s) < 1e-9
            for request_id in result.first_token_ids:
                assert request_id not in self.first
                self.first.add(request_id)
            for request_id, _ in result.tokens:
                assert request_id in self.first
                self.tokens[request_id] = self.tokens.get(request_id, 0) + 1
            for done in result.finished:
                self.finished[done.request_id] = (done.finish_reason, done.usage.completion_tokens)
        assert core.num_running <= profile.max_num_seqs
        assert core.kv_blocks_used <= profile.kv_cache_blocks
        for event in core.drain_cache_events():
            assert not set(event.removed) - self.mirror
            self.mirror -= set(event.removed)
            if isinstance(event, SimCacheEvent):
                assert profile.host_kv_blocks
                assert not set(event.offloaded) - self.mirror, "only device blocks offload"
                self.mirror -= set(event.offloaded)
                self.host |= set(event.offloaded)
                self.host -= set(event.offload_removed)
            self.mirror |= set(event.stored)
            self.host -= set(event.stored)
        assert self.mirror == core.cache_contents()
        assert self.host == core.host_contents()
        assert len(self.mirror) <= profile.kv_cache_blocks
        assert len(self.host) <= profile.host_kv_blocks


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_budgets_capacity_events_and_outputs_hold_for_random_arrivals(
    scenario: tuple[SimProfile, list[Arrival]],
) -> None:
    profile, arrivals = scenario
    core = SimCore(profile)
    sim = VirtualSim(core)
    checker = Checker(core)
    aborted: set[str] = set()
    now_s = 0.0
    for i, arrival in enumerate(arrivals):
        now_s += arrival.gap_ms / 1000
        checker.check(sim.advance_to(now_s))
        if arrival.abort_earlier is not None:
            victim = f"r{arrival.abort_earlier}"
            if sim.abort(victim) is not None:
                aborted.add(victim)
        sampling = SamplingSettings(max_tokens=arrival.max_tokens)
        sim.add(GenerationRequest(f"r{i}", prompt(i, arrival), sampling, arrival.salt))
    checker.check(sim.run_until_idle())

    for i, arrival in enumerate(arrivals):
        request_id = f"r{i}"
        if request_id in aborted:
            assert request_id not in checker.finished
            assert checker.tokens.get(request_id, 0) < arrival.max_tokens
        else:
            assert checker.finished[request_id] == ("length", arrival.max_tokens)
            assert checker.tokens[request_id] == arrival.max_tokens
    stats = core.stats()
    assert (stats.running, stats.waiting, stats.pending_prefill_tokens) == (0, 0, 0)
    assert core.kv_blocks_used == 0
    assert stats.prefix_cache_hits <= stats.prefix_cache_queries
