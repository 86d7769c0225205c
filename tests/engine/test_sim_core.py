"""SimCore: prefill cost and prefix hits, the block-level LRU, events, abort, preemption,
stop strings, statistics and request validation — case by case, in virtual time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from firstlight.engine.protocol import CacheEvent, GenerationRequest, SamplingSettings
from firstlight.engine.sim import (
    PROFILES,
    SimCacheEvent,
    SimCore,
    SimProfile,
    TrueCacheView,
    VirtualSim,
)
from firstlight.errors import InvalidRequestError, PromptTooLongError
from firstlight.prefix import HashScheme, hint_hashes

TINY = SimProfile(
    name="tiny",
    description="a small replica for tests",
    step_overhead_ms=10.0,
    prefill_ms_per_token=1.0,
    decode_ms_per_seq=0.5,
    max_num_batched_tokens=64,
    max_num_seqs=4,
    block_size=4,
    kv_cache_blocks=32,
    max_model_len=128,
)


def req(
    request_id: str,
    tokens: range | tuple[int, ...],
    max_tokens: int = 1,
    *,
    salt: str | None = None,
    stop: tuple[str, ...] = (),
) -> GenerationRequest:
    return GenerationRequest(
        request_id, tuple(tokens), SamplingSettings(max_tokens=max_tokens, stop=stop), salt
    )


def run_alone(core: SimCore, request: GenerationRequest) -> float:
    """Run ``request`` on an otherwise idle core; return its TTFT in seconds."""
    sim = VirtualSim(core)
    sim.add(request)
    ttft = [s.end_s for s in sim.run_until_idle() if request.request_id in s.result.first_token_ids]
    return ttft[0]


def hashes(
    core: SimCore, tokens: range | tuple[int, ...], salt: str | None = None
) -> tuple[int, ...]:
    return hint_hashes(tuple(tokens), core.scheme, cache_salt=salt)


# --- prefill cost and prefix hits -----------------------------------------------------------


def test_a_prefix_hit_cuts_ttft_by_cached_tokens_times_the_per_token_cost() -> None:
    profile = PROFILES["h100-llama-8b"]
    core = SimCore(profile)
    shared = tuple(range(768))  # 48 blocks of 16
    cold = run_alone(core, req("cold", shared + tuple(range(10_000, 10_256))))
    warm = run_alone(core, req("warm", shared + tuple(range(20_000, 20_256))))
    assert cold == pytest.approx((9.5 + 1024 * profile.prefill_ms_per_token) / 1000)
    assert cold - warm == pytest.approx(768 * profile.prefill_ms_per_token / 1000)
    assert core.stats().prefix_cache_hits == 768


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    profile = PROFILES["cpu-smollm2-135m"]  # budget 2048 tokens
    core = SimCore(profile)
    core.add(req("long", range(2000), max_tokens=1))
    core.add(req("next", range(5000, 5100), max_tokens=1))
    first, second = core.step(), core.step()
    assert first is not None
    assert second is not None
    assert core.step() is None
    assert (first.prefill_tokens, second.prefill_tokens) == (2048, 52)
    assert first.first_token_ids == ["long"]
    assert second.first_token_ids == ["next"]
    # "long" whole and "next"'s first 48 tokens, then "next"'s last 52 at positions 48-99.
    first_context = profile.prefill_context(0, 2000) + profile.prefill_context(0, 48)
    assert first.prefill_context == first_context
    assert second.prefill_context == profile.prefill_context(48, 52) == (100**2 - 48**2) / 2
    assert first.duration_s == pytest.approx(profile.step_ms(2048, 0, first_context) / 1000)
    assert second.duration_s == pytest.approx(
        (profile.step_overhead_ms + profile.prefill_ms(48, 52)) / 1000
    )


def test_a_chunk_later_in_its_prompt_costs_more_by_the_context_term() -> None:
    profile = replace(TINY, prefill_ms_per_token_per_context=0.01)
    core = SimCore(profile)
    shared = tuple(range(24))  # 6 blocks of 4
    run_alone(core, req("prefix", shared))
    late = run_alone(core, req("late", shared + tuple(range(100, 108))))  # [24, 32)
    early = run_alone(core, req("early", tuple(range(200, 208))))  # [0, 8)
    assert late == pytest.approx((10.0 + 8 * 1.0 + 0.01 * (32**2 - 24**2) / 2) / 1000)
    assert early == pytest.approx((10.0 + 8 * 1.0 + 0.01 * 8**2 / 2) / 1000)
    assert late - early == pytest.approx(0.01 * (224 - 32) / 1000)
    assert profile.prefill_ms(24, 8) - profile.prefill_ms(0, 8) == pytest.approx(0.01 * 192)
    # Without the context term (the default) the position does not matter.
    assert TINY.prefill_ms(24, 8) == TINY.prefill_ms(0, 8) == 8.0


def test_a_fully_cached_prompt_still_computes_its_last_block() -> None:
    core = SimCore(TINY)
    run_alone(core, req("a", range(32)))
    sim = VirtualSim(core)
    sim.add(req("b", range(32)))
    (step,) = sim.run_until_idle()
    assert step.result.prefill_tokens == 4  # vLLM caps a hit at prompt - 1 tokens
    assert step.result.finished[0].usage.cached_prompt_tokens == 28


def test_a_cache_salt_separates_tenants() -> None:
    core = SimCore(TINY)
    run_alone(core, req("a", range(32), salt="tenant-a"))
    sim = VirtualSim(core)
    sim.add(req("b", range(32), salt="tenant-b"))
    (step,) = sim.run_until_idle()
    assert step.result.finished[0].usage.cached_prompt_tokens == 0


def test_stored_events_carry_the_gateways_hint_hashes() -> None:
    core = SimCore(TINY, hash_seed=7)
    run_alone(core, req("a", range(30), salt="s"))
    (event,) = core.drain_cache_events()
    expected = hint_hashes(tuple(range(30)), HashScheme(4, 7), cache_salt="s")
    assert event.stored == expected
    assert event.removed == ()
    assert core.drain_cache_events() == []


# --- the block-level LRU ---------------------------------------------------------------------


def prompt_of(name: str) -> range:
    """A 32-token prompt (8 blocks) of its own for each one-letter name."""
    start = 1000 * (ord(name[0]) - ord("a") + 1)
    return range(start, start + 32)


def fill(core: SimCore, *names: str) -> dict[str, tuple[int, ...]]:
    """Run one request per name, one after the other; return their block hashes."""
    for name in names:
        run_alone(core, req(name, prompt_of(name)))
    return {name: hashes(core, prompt_of(name)) for name in names}


def test_lru_evicts_the_least_recently_used_blocks_first() -> None:
    core = SimCore(TINY)  # 32 blocks: room for exactly four 8-block prompts
    blocks = fill(core, "a", "b", "c", "d")
    run_alone(core, req("a-again", prompt_of("a")))  # a becomes the most recent
    core.drain_cache_events()
    blocks |= fill(core, "e")
    evicted, stored = core.drain_cache_events()  # announced when scheduled, when done
    assert set(evicted.removed) == set(blocks["b"])
    assert stored.stored == blocks["e"]
    assert core.cache_contents() == frozenset(blocks["a"] + blocks["c"] + blocks["d"] + blocks["e"])


def test_received_blocks_are_a_prefix_hit_and_announced_stored() -> None:
    profile = PROFILES["h100-llama-8b"]
    donor, core = SimCore(profile), SimCore(profile)
    prompt = tuple(range(1024))
    cold = run_alone(donor, req("cold", prompt))
    pulled = hashes(core, prompt[:768])  # 48 blocks of another site's KV
    assert core.receive_blocks(pulled) == 48
    (event,) = core.drain_cache_events()
    assert event.stored == pulled
    warm = run_alone(core, req("pulled", prompt))
    assert cold - warm == pytest.approx(768 * profile.prefill_ms_per_token / 1000)


def test_received_blocks_evict_the_least_recent_and_stop_where_everything_is_pinned() -> None:
    core = SimCore(TINY)  # 32 blocks
    blocks = fill(core, "a", "b", "c", "d")
    core.drain_cache_events()
    incoming = hashes(core, range(5000, 5016))  # 4 blocks
    assert core.receive_blocks(incoming) == 4
    (event,) = core.drain_cache_events()
    assert set(event.removed) == set(blocks["a"][4:])  # a's tail, least recently released
    assert event.stored == incoming
    full = SimCore(TINY)
    sim = VirtualSim(full)
    sim.add(req("grows", range(64), max_tokens=64))  # each grows to 32 blocks: they
    sim.add(req("grows-too", range(1000, 1064), max_tokens=64))  # fill the cache
    t = 0.0
    while full.kv_blocks_used < TINY.kv_cache_blocks and t < 5.0:
        t += 0.001
        sim.advance_to(t)
    assert full.kv_blocks_used == TINY.kv_cache_blocks  # every block held by a request
    assert full.receive_blocks(incoming) == 0  # no room: nothing lands


def test_a_prompt_releases_its_tail_first_so_its_leading_blocks_outlive_it() -> None:
    core = SimCore(TINY)
    blocks = fill(core, "a", "b", "c", "d")
    core.drain_cache_events()
    run_alone(core, req("e", range(9000, 9016)))  # needs 4 of a's 8 blocks
    evicted, _ = core.drain_cache_events()
    assert evicted.removed == tuple(reversed(blocks["a"][4:]))
    assert core.cached_prefix_blocks(blocks["a"]) == 4


def test_blocks_of_running_requests_are_pinned_and_never_evicted() -> None:
    core = SimCore(TINY)
    sim = VirtualSim(core)
    sim.add(req("long-running", range(32), max_tokens=30))  # grows to 16 blocks
    sim.advance_to(0.05)  # prefilled, now decoding
    pinned = hashes(core, range(32))
    assert all(core.is_pinned(h) for h in pinned)
    for i in range(6):  # 6 x 4 blocks: more than the ~20 left beside it
        sim.add(req(f"other-{i}", range(100 * (i + 1), 100 * (i + 1) + 16)))
    sim.advance_to(0.25)
    assert core.num_running == 1  # every other request came and went
    assert core.num_waiting == 0
    removed = {h for event in core.drain_cache_events() for h in event.removed}
    assert removed  # the others evicted each other ...
    assert not removed & set(pinned)  # ... but never a pinned block
    assert core.cached_prefix_blocks(pinned) == 8
    sim.run_until_idle()
    assert not any(core.is_pinned(h) for h in pinned)


def test_events_replayed_in_order_equal_the_cache_contents() -> None:
    core = SimCore(TINY)
    fill(core, "a", "b", "c", "d", "e", "f")
    mirror: set[int] = set()
    for event in core.drain_cache_events():
        mirror -= set(event.removed)
        mirror |= set(event.stored)
    assert mirror == core.cache_contents()
    assert len(mirror) <= TINY.kv_cache_blocks


# --- the host tier (KV offloading) --------------------------------------------------------

OFFLOADING = replace(TINY, host_kv_blocks=16, reload_ms_per_token=0.1)
"""TINY with a host tier of 16 blocks, reloading a token in 0.1 ms (prefill: 1 ms)."""


def replay_tiers(events: list[CacheEvent]) -> tuple[set[int], set[int]]:
    """Device and host contents from cache events, in BlockEvent's order."""
    device: set[int] = set()
    host: set[int] = set()
    for event in events:
        if event.cleared:
            device.clear()
            host.clear()
        device -= set(event.removed)
        if isinstance(event, SimCacheEvent):
            device -= set(event.offloaded)
            host |= set(event.offloaded)
            host -= set(event.offload_removed)
        device |= set(event.stored)
        host -= set(event.stored)
    return device, host


def test_an_offloaded_block_is_reloaded_at_the_reload_rate_not_prefilled() -> None:
    core = SimCore(OFFLOADING)  # 32 device blocks: four 8-block prompts
    blocks = fill(core, "a", "b", "c", "d", "e")  # e pushes a out to the host tier
    assert core.host_contents() == frozenset(blocks["a"])
    assert core.cached_prefix_blocks(blocks["a"]) == 0
    assert core.host_prefix_blocks(blocks["a"], 0) == 8
    core.drain_cache_events()
    # 32 tokens: 7 blocks (28 tokens) reloaded, the last block's 4 tokens computed.
    ttft = run_alone(core, req("a-again", prompt_of("a")))
    assert ttft == pytest.approx((10 + 4 * 1.0 + 28 * 0.1) / 1000)
    blind = SimCore(TINY)
    fill(blind, "a", "b", "c", "d", "e")
    assert run_alone(blind, req("a-again", prompt_of("a"))) == pytest.approx((10 + 32) / 1000)
    # Reloaded blocks are device blocks again, announced stored; making room for them
    # offloaded b's.
    assert core.cached_prefix_blocks(blocks["a"]) == 8
    assert not core.host_contents() & set(blocks["a"])
    events = core.drain_cache_events()
    assert any(isinstance(e, SimCacheEvent) and set(e.offloaded) & set(blocks["b"]) for e in events)
    assert set(blocks["a"][:7]) <= {h for e in events for h in e.stored}
    assert core.stats().prefix_cache_hits == 28


def test_the_host_tier_is_an_lru_of_bounded_size() -> None:
    core = SimCore(replace(OFFLOADING, host_kv_blocks=8))
    blocks = fill(core, "a", "b", "c", "d", "e")
    assert core.host_contents() == frozenset(blocks["a"])
    core.drain_cache_events()
    fill(core, "f")  # offloads b: a, the least recently offloaded, leaves the host tier
    assert core.host_contents() == frozenset(blocks["b"])
    events = core.drain_cache_events()
    assert {h for e in events if isinstance(e, SimCacheEvent) for h in e.offload_removed} == set(
        blocks["a"]
    )
    ttft = run_alone(core, req("a-again", prompt_of("a")))
    assert ttft == pytest.approx((10 + 32) / 1000), "dropped from both tiers: recomputed"


def test_cache_events_replayed_by_tier_equal_both_tiers() -> None:
    core = SimCore(replace(OFFLOADING, host_kv_blocks=12))
    fill(core, "a", "b", "c", "d", "e", "f", "a", "g", "b", "h", "c")
    device, host = replay_tiers(core.drain_cache_events())
    assert device == core.cache_contents()
    assert host == core.host_contents()
    assert len(host) <= 12
    assert not device & host


def test_the_true_cache_view_reads_the_host_tier_after_the_device_run() -> None:
    core = SimCore(OFFLOADING)
    blocks = fill(core, "a", "b", "c", "d", "e")
    view = TrueCacheView({"r": core})
    chain = blocks["a"]
    assert view.longest_prefix(chain) == {}
    assert view.host_prefix(chain, {}) == {"r": 8}
    assert view.host_prefix(blocks["e"], view.longest_prefix(blocks["e"])) == {}


def test_without_a_host_tier_events_stay_plain() -> None:
    core = SimCore(TINY)
    fill(core, "a", "b", "c", "d", "e")
    assert not any(isinstance(e, SimCacheEvent) for e in core.drain_cache_events())
    assert core.host_contents() == frozenset()


# --- abort, preemption, stop strings -----------------------------------------------------


def test_abort_frees_the_slot_and_unpins_the_blocks() -> None:
    core = SimCore(TINY)
    sim = VirtualSim(core)
    sim.add(req("a", range(32), max_tokens=20))
    sim.advance_to(0.1)
    assert core.num_running == 1
    assert core.kv_blocks_used > 8
    done = sim.abort("a")
    assert done is not None
    assert done.finish_reason == "abort"
    assert done.usage.completion_tokens > 0
    assert core.num_running == 0
    assert core.kv_blocks_used == 0
    assert not any(core.is_pinned(h) for h in hashes(core, range(32)))
    assert core.cached_prefix_blocks(hashes(core, range(32))) == 8  # still reusable
    assert sim.abort("a") is None


def test_abort_mid_step_leaves_the_request_out_of_that_steps_tokens() -> None:
    core = SimCore(TINY)
    core.add(req("a", range(8), max_tokens=5))
    core.add(req("b", range(100, 108), max_tokens=5))
    assert core.begin_step() is not None
    core.abort("a")
    result = core.finish_step()
    assert [rid for rid, _ in result.tokens] == ["b"]
    assert core.stats().pending_prefill_tokens == 0


def test_aborting_a_waiting_request_drops_its_pending_work() -> None:
    core = SimCore(replace(TINY, max_num_seqs=1))
    core.add(req("a", range(8), max_tokens=5))
    core.add(req("b", range(100, 140), max_tokens=5))
    core.step()
    assert core.stats().pending_prefill_tokens == 40
    core.abort("b")
    assert core.stats().waiting == 0
    assert core.stats().pending_prefill_tokens == 0


def test_a_full_kv_cache_preempts_the_newest_request_which_recomputes_later() -> None:
    core = SimCore(TINY)  # 32 blocks; each request grows to 17 blocks
    sim = VirtualSim(core)
    sim.add(req("first", range(60), max_tokens=8))
    sim.add(req("second", range(200, 260), max_tokens=8))
    steps = sim.run_until_idle()
    assert any(s.result.preempted == ["second"] for s in steps)
    tokens: dict[str, list[int]] = {"first": [], "second": []}
    for step in steps:
        assert core.kv_blocks_used <= TINY.kv_cache_blocks
        for rid, token_id in step.result.tokens:
            tokens[rid].append(token_id)
    alone = SimCore(TINY)
    solo = VirtualSim(alone)
    solo.add(req("second", range(200, 260), max_tokens=8))
    solo_tokens = [t for s in solo.run_until_idle() for _, t in s.result.tokens]
    assert tokens["second"] == solo_tokens  # same output despite the recomputation
    assert len(tokens["first"]) == 8


def test_a_stop_string_ends_the_request_with_finish_reason_stop() -> None:
    core = SimCore(TINY, seed=3)
    sim = VirtualSim(core)
    sim.add(req("probe", range(8), max_tokens=6))
    texts = [core.text(t) for s in sim.run_until_idle() for _, t in s.result.tokens]
    stop_word = texts[3].strip()
    assert stop_word not in "".join(texts[:3])
    core = SimCore(TINY, seed=3)
    sim = VirtualSim(core)
    sim.add(req("probe", range(8), max_tokens=6, stop=(stop_word,)))
    steps = sim.run_until_idle()
    (done,) = steps[-1].result.finished
    assert done.finish_reason == "stop"
    assert done.usage.completion_tokens == 4


# --- statistics and validation -----------------------------------------------------------------


def test_stats_are_labelled_simulated_and_count_pending_uncached_work() -> None:
    core = SimCore(TINY)
    fresh = core.stats()
    assert fresh.simulated is True
    assert fresh.prefill_tokens_per_s is None
    assert fresh.inter_token_latency_ms is None
    run_alone(core, req("warmup", range(48)))
    core.add(req("a", tuple(range(48)) + tuple(range(500, 520))))  # 48 tokens cached
    stats = core.stats()
    assert stats.waiting == 1
    assert stats.pending_prefill_tokens == 20
    assert stats.prefix_cache_queries == 48
    assert stats.prefix_cache_hits == 0
    core.step()
    stats = core.stats()
    assert stats.pending_prefill_tokens == 0
    assert stats.prefix_cache_queries == 48 + 68
    assert stats.prefix_cache_hits == 48
    assert stats.prefill_tokens_per_s == pytest.approx((48 + 20) / ((10 + 48 + 10 + 20) / 1000))


def test_kv_usage_and_inter_token_latency_follow_the_running_requests() -> None:
    core = SimCore(TINY)
    core.add(req("a", range(16), max_tokens=10))
    core.step()
    core.step()
    stats = core.stats()
    assert stats.running == 1
    assert stats.kv_cache_usage == pytest.approx(5 / 32)  # 4 prompt blocks + 1 decode block
    assert stats.inter_token_latency_ms == pytest.approx(10.5)


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        pytest.param(req("a", range(8), max_tokens=0), InvalidRequestError, id="max-tokens-0"),
        pytest.param(req("a", range(8), max_tokens=-3), InvalidRequestError, id="max-tokens-neg"),
        pytest.param(req("a", ()), InvalidRequestError, id="empty-prompt"),
        pytest.param(req("a", range(120), max_tokens=9), PromptTooLongError, id="too-long"),
    ],
)
def test_invalid_requests_raise_typed_errors(
    request_: GenerationRequest, error: type[Exception]
) -> None:
    core = SimCore(TINY)
    with pytest.raises(error):
        core.add(request_)
    assert not core.has_work


def test_a_duplicate_request_id_or_wrong_block_hashes_are_refused() -> None:
    core = SimCore(TINY)
    core.add(req("a", range(8)))
    with pytest.raises(InvalidRequestError, match="already in use"):
        core.add(req("a", range(8)))
    with pytest.raises(InvalidRequestError, match="expected 2"):
        core.add(req("b", range(8)), block_hashes=(1, 2, 3))


def test_precomputed_block_hashes_are_used_as_given() -> None:
    core = SimCore(TINY)
    run_alone(core, req("a", range(8)))
    core.drain_cache_events()
    core.add(req("b", range(100, 108)), block_hashes=(11, 22))
    core.step()
    (event,) = core.drain_cache_events()
    assert event.stored == (11, 22)


def test_stepping_out_of_order_is_a_programming_error() -> None:
    core = SimCore(TINY)
    assert core.begin_step() is None
    with pytest.raises(RuntimeError):
        core.finish_step()
    core.add(req("a", range(8)))
    core.begin_step()
    with pytest.raises(RuntimeError):
        core.begin_step()


def test_the_waiting_gauge_counts_what_scheduling_left_not_what_arrived_mid_step() -> None:
    core = SimCore(TINY)  # max_num_seqs 4
    for i in range(6):
        core.add(req(f"r{i}", range(100 * i, 100 * i + 8), max_tokens=3))
    core.begin_step()
    # Four admitted, two left waiting: what vLLM's num_requests_waiting shows.
    assert (core.num_running, core.num_waiting, core.waiting_after_schedule) == (4, 2, 2)
    core.finish_step()
    core.add(req("late", range(900, 908)))  # arrives between steps
    assert core.num_waiting == 3
    assert core.waiting_after_schedule == 2  # not counted until a step schedules
    while core.has_work:
        core.step()
    assert core.waiting_after_schedule == 0
