"""Baseline policies: who wins and why, cycles, seeded draws, thresholds, the approximate
prefix state against brute force, eviction bounds, and the registry."""

from __future__ import annotations

import random
import typing
from collections.abc import Mapping, Sequence

import pytest
from annotated_types import Ge, Gt, Le, Lt
from hypothesis import given, settings
from hypothesis import strategies as st

from firstlight.config import PolicyName
from firstlight.errors import ConfigError
from firstlight.routing import (
    REGISTRY,
    Candidate,
    Decision,
    ReplicaView,
    RequestView,
    RoutingInput,
    RoutingPolicy,
    build_policy,
    policy_names,
)
from firstlight.routing.baselines import (
    CacheAwareParams,
    CacheAwarePolicy,
    PrefixAffinityParams,
    PrefixAffinityPolicy,
    WeightedScorerParams,
    WeightedScorerPolicy,
)
from firstlight.routing.baselines._prefix_tree import ApproxPrefixTree

BASELINES = [
    "round_robin",
    "random",
    "least_queue",
    "power_of_two",
    "cache_aware",
    "prefix_affinity",
    "weighted_scorer",
    "llmd_sticky",
    "dynamo_kv",
]


class Clock:
    """A settable clock (the injected time source)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replica(rid: str, queue: int = 0, *, kv: float = 0.0, running: int = 0) -> ReplicaView:
    return ReplicaView(rid, "us-east", queue_len=queue, running=running, kv_cache_usage=kv)


def request(*blocks: int) -> RequestView:
    return RequestView("q", prompt_tokens=32 * len(blocks), block_hashes=blocks, block_size=32)


def policy(name: str, params: Mapping[str, float] | None = None, seed: int = 0) -> RoutingPolicy:
    return build_policy(name, params, rng=random.Random(seed), clock=Clock())


def sent(p: RoutingPolicy, blocks: Sequence[int], rid: str) -> None:
    """History: a prompt was routed to ``rid``."""
    p.on_routed(request(*blocks), Candidate(rid, "us-east", 0.0))


def choose(p: RoutingPolicy, replicas: Sequence[ReplicaView], *blocks: int) -> Decision:
    return p.choose(RoutingInput(request(*blocks), replicas))


def assert_well_ranked(decision: Decision, replicas: Sequence[ReplicaView]) -> None:
    ids = [c.replica_id for c in decision.ranked]
    assert sorted(ids) == sorted(r.replica_id for r in replicas)
    assert all(c.terms is None for c in decision.ranked)
    scores = [c.score for c in decision.ranked]
    assert scores == sorted(scores)


r = replica  # short name for the tables


# (id, policy, params, history [(blocks, replica)], replicas, prompt, winner, reason)
CASES = [
    ("rr-starts-at-lowest-id", "round_robin", {}, [], [r("b"), r("c"), r("a")], (1,), "a", "round-robin"),
    ("jsq", "least_queue", {}, [], [r("a", 5), r("b", 2), r("c", 7)], (1,), "b", "shortest-queue"),
    ("p2c-of-two-shorter-wins", "power_of_two", {}, [], [r("a", 5), r("b", 2)], (1,), "b", "power-of-two"),
    # 100 - 0 > 64 and 100 > 0 * 1.5: the prefix held by a does not matter
    ("ca-imbalanced-ignores-prefix", "cache_aware", {}, [((1, 2, 3, 4), "a")], [r("a", 100), r("b")], (1, 2, 3, 4), "b", "imbalanced-shortest-queue"),
    ("ca-balanced-prefix-beats-load", "cache_aware", {}, [((1, 2, 3, 4), "a")], [r("a", 60), r("b")], (1, 2, 3, 9), "a", "prefix-match"),
    # 300 - 230 > 64 but 300 < 230 * 1.5: both conditions are needed
    ("ca-abs-without-rel-is-balanced", "cache_aware", {}, [((1, 2, 3, 4), "a")], [r("a", 300), r("b", 230)], (1, 2, 3, 4), "a", "prefix-match"),
    ("ca-longest-match-wins", "cache_aware", {}, [((1, 2), "a"), ((1, 2, 3, 4), "b")], [r("a"), r("b")], (1, 2, 3, 4), "b", "prefix-match"),
    # a matches 1/4 <= 0.3: the least loaded wins (SMG; sgl-router took the smallest tree, c)
    ("ca-weak-match-least-load", "cache_aware", {}, [((1, 2, 3, 4), "a"), ((9,), "b")], [r("a", 3), r("b", 1), r("c", 5)], (1, 7, 8, 6), "b", "least-load"),
    ("ca-match-equal-to-threshold-is-weak", "cache_aware", {"cache_threshold": 0.5}, [((1, 2, 3, 4), "a")], [r("a", 1), r("b")], (1, 2, 7, 8), "b", "least-load"),
    ("pa-imbalanced-power-of-two", "prefix_affinity", {}, [((1, 2, 3, 4), "a")], [r("a", 20), r("b")], (1, 2, 3, 4), "b", "imbalanced-power-of-two"),
    ("pa-spread-equal-to-threshold-is-balanced", "prefix_affinity", {}, [((1, 2, 3, 4), "a")], [r("a", 10), r("b")], (1, 2, 3, 4), "a", "prefix-match"),
    ("pa-least-loaded-of-best-matches", "prefix_affinity", {}, [((1, 2, 3), "a"), ((1, 2, 3), "b"), ((1, 2), "c")], [r("a", 5), r("b", 3), r("c")], (1, 2, 3, 4), "b", "prefix-match"),
    ("pa-no-match-least-loaded-smallest-tree", "prefix_affinity", {}, [((1, 2), "a")], [r("a"), r("b", 2), r("c", 1)], (7, 8), "c", "smallest-tree"),
    ("ws-kv-usage-decides", "weighted_scorer", {}, [], [r("a", kv=0.9), r("b", kv=0.1)], (1, 2), "b", "weighted-score"),
    # a: 0*2 + 1*2 + 1*3 = 5 beats b: 1*2 + 1*2 + 0*3 = 4
    ("ws-full-prefix-beats-queue", "weighted_scorer", {}, [((1, 2, 3, 4), "a")], [r("a", 10), r("b")], (1, 2, 3, 4), "a", "weighted-score"),
    # a: 0 + 2 + 0.25*3 = 2.75 loses to b: 4
    ("ws-queue-beats-partial-prefix", "weighted_scorer", {}, [((1, 5, 6, 7), "a")], [r("a", 10), r("b")], (1, 2, 3, 4), "b", "weighted-score"),
    # the queue scorer reads waiting requests: a has 10 running, 0 waiting
    ("ws-queue-is-waiting-requests", "weighted_scorer", {}, [], [r("a", 10, running=10), r("b", 4)], (1,), "a", "weighted-score"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "params", "history", "replicas", "prompt", "winner", "reason"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)  # fmt: skip
def test_who_wins_and_why(
    name: str,
    params: dict[str, float],
    history: list[tuple[tuple[int, ...], str]],
    replicas: list[ReplicaView],
    prompt: tuple[int, ...],
    winner: str,
    reason: str,
) -> None:
    p = policy(name, params)
    for blocks, rid in history:
        sent(p, blocks, rid)
    decision = choose(p, replicas, *prompt)
    assert (decision.winner.replica_id, decision.reason) == (winner, reason)
    assert decision.policy == name
    assert_well_ranked(decision, replicas)


def test_round_robin_cycles_in_replica_id_order_whatever_the_input_order() -> None:
    p = policy("round_robin")
    replicas = [replica("c"), replica("a"), replica("b")]
    winners = [choose(p, replicas, 1).winner.replica_id for _ in range(6)]
    assert winners == ["a", "b", "c", "a", "b", "c"]
    decision = choose(p, list(reversed(replicas)), 1)
    assert [c.replica_id for c in decision.ranked] == ["a", "b", "c"]
    assert choose(p, replicas, 1).winner.replica_id == "b"


def test_random_is_one_uniform_draw_from_the_seeded_rng() -> None:
    replicas = [replica(x, q) for x, q in zip("abcd", [9, 0, 3, 1], strict=True)]
    mirror = random.Random(7)
    expected = [replicas[mirror.randrange(4)].replica_id for _ in range(200)]
    for _ in range(2):  # a second policy with the same seed draws the same
        p = policy("random", seed=7)
        assert [choose(p, replicas, 1).winner.replica_id for _ in range(200)] == expected
    assert set(expected) == set("abcd")


def test_power_of_two_picks_the_shorter_queue_of_the_two_it_sampled() -> None:
    queues = {"a": 3, "b": 1, "c": 4, "d": 0, "e": 2}
    replicas = [replica(x, q) for x, q in queues.items()]
    p, again = policy("power_of_two", seed=11), policy("power_of_two", seed=11)
    mirror = random.Random(11)  # Ray's sampling: i, then j over the n - 1 others
    winners = []
    for _ in range(300):
        decision = choose(p, replicas, 1)
        assert choose(again, replicas, 1) == decision
        i, j = mirror.randrange(5), mirror.randrange(4)
        sampled = {replicas[i].replica_id, replicas[j + (j >= i)].replica_id}
        ranked = [c.replica_id for c in decision.ranked]
        assert set(ranked[:2]) == sampled
        assert ranked[0] == min(sampled, key=queues.__getitem__)
        assert [queues[x] for x in ranked[2:]] == sorted(queues[x] for x in ranked[2:])
        winners.append(ranked[0])
    assert "c" not in winners  # the longest queue loses to whichever it is sampled with
    assert set(winners) == {"a", "b", "d", "e"}


def test_power_of_two_orders_two_equal_queues_by_one_random_bit() -> None:
    """With two candidates Ray shuffles them by one bit (``getrandbits(1)``): set, the
    first listed is sampled first and wins the tie; clear, the second does."""
    replicas = [replica("a", 2), replica("b", 2)]
    p = policy("power_of_two", seed=5)
    mirror = random.Random(5)
    expected = [["a", "b"] if mirror.getrandbits(1) else ["b", "a"] for _ in range(64)]
    ranked = [[c.replica_id for c in choose(p, replicas, 1).ranked] for _ in range(64)]
    assert ranked == expected
    assert {order[0] for order in expected} == {"a", "b"}


@pytest.mark.parametrize("name", ["least_queue", "power_of_two"])
def test_equal_queues_are_a_random_tie(name: str) -> None:
    p = policy(name, seed=3)
    replicas = [replica("a", 1), replica("b", 1), replica("c", 5)]
    winners = {choose(p, replicas, 1).winner.replica_id for _ in range(100)}
    assert winners == {"a", "b"}


def test_cache_aware_switches_between_shortest_queue_and_prefix_match() -> None:
    p = policy("cache_aware")
    sent(p, (1, 2, 3, 4), "a")
    balanced, imbalanced = [replica("a", 40), replica("b")], [replica("a", 100), replica("b")]
    first = choose(p, balanced, 1, 2, 3, 4)
    assert (first.winner.replica_id, first.reason) == ("a", "prefix-match")
    second = choose(p, imbalanced, 1, 2, 3, 4)
    assert (second.winner.replica_id, second.reason) == ("b", "imbalanced-shortest-queue")
    assert {c.replica_id: c.cached_blocks for c in second.ranked} == {"a": 4, "b": 0}
    sent(p, (5, 6), second.winner.replica_id)
    third = choose(p, balanced, 5, 6, 7)
    assert (third.winner.replica_id, third.reason) == ("b", "prefix-match")


@pytest.mark.parametrize(
    ("threshold", "matched", "blocks", "reason"),
    [(0.1, 1, 10, "prefix-match"), (0.1, 1, 11, "smallest-tree"), (0.1, 0, 10, "smallest-tree"),
     (0.5, 5, 10, "prefix-match"), (0.5, 4, 10, "smallest-tree")],
)  # fmt: skip
def test_prefix_affinity_prefers_matches_at_or_above_the_rate_threshold(
    threshold: float, matched: int, blocks: int, reason: str
) -> None:
    p = policy("prefix_affinity", {"match_rate_threshold": threshold})
    sent(p, [*range(100, 100 + matched), 999], "a")  # a also has the larger tree
    prompt = [*range(100, 100 + matched), *range(500, 500 + blocks - matched)]
    decision = choose(p, [replica("a"), replica("b")], *prompt)
    assert decision.reason == reason
    assert decision.winner.replica_id == ("a" if reason == "prefix-match" else "b")


blocks_st = st.lists(st.integers(0, 4), max_size=6)
history_st = st.lists(st.tuples(blocks_st, st.sampled_from("abc")), max_size=25)


@settings(max_examples=150, deadline=None)
@given(history=history_st, prompt=blocks_st)
def test_cache_aware_tree_matches_brute_force(
    history: list[tuple[list[int], str]], prompt: list[int]
) -> None:
    p = CacheAwarePolicy(CacheAwareParams(), rng=random.Random(0), clock=Clock())
    for blocks, rid in history:
        sent(p, blocks, rid)
    decision = choose(p, [replica("a"), replica("b"), replica("c")], *prompt)
    for c in decision.ranked:
        routed = [b for b, rid in history if rid == c.replica_id]
        assert c.cached_blocks == max((_common_prefix(b, prompt) for b in routed), default=0)
        prefixes = {tuple(b[:k]) for b in routed for k in range(1, len(b) + 1)}
        assert p.tree_size(c.replica_id) == len(prefixes)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _epp_credits(
    history: list[tuple[list[int], str]], prompt: list[int], capacity: int
) -> dict[str, int]:
    """The EPP's indexer and matchLongestPrefix, naively."""
    lru: dict[str, list[int]] = {}
    for blocks, rid in history:
        entries = lru.setdefault(rid, [])
        for b in blocks:
            if b in entries:
                entries.remove(b)
            entries.append(b)
            if len(entries) > capacity:
                entries.pop(0)
    credits: dict[str, int] = {}
    for b in prompt:
        holders = [rid for rid, entries in lru.items() if b in entries]
        if not holders:
            break
        for rid in holders:
            credits[rid] = credits.get(rid, 0) + 1
    return credits


@settings(max_examples=150, deadline=None)
@given(history=history_st, prompt=blocks_st, capacity=st.integers(1, 8))
def test_weighted_scorer_prefix_index_matches_the_epp_indexer(
    history: list[tuple[list[int], str]], prompt: list[int], capacity: int
) -> None:
    params = WeightedScorerParams(lru_capacity_blocks=capacity)
    p = WeightedScorerPolicy(params, rng=random.Random(0), clock=Clock())
    for blocks, rid in history:
        sent(p, blocks, rid)
    decision = choose(p, [replica("a"), replica("b"), replica("c")], *prompt)
    credits = _epp_credits(history, prompt, capacity)
    assert {c.replica_id: c.cached_blocks for c in decision.ranked} == {
        x: credits.get(x, 0) for x in "abc"
    }
    assert all(p.indexed_blocks(x) <= capacity for x in "abc")


replica_st = st.tuples(
    st.integers(0, 1000), st.integers(0, 1000), st.floats(-1, 2) | st.just(float("nan"))
)


@settings(max_examples=150, deadline=None)
@given(replicas=st.lists(replica_st, min_size=1, max_size=8), history=history_st, prompt=blocks_st)
def test_weighted_scorer_component_scores_stay_in_the_unit_interval(
    replicas: list[tuple[int, int, float]],
    history: list[tuple[list[int], str]],
    prompt: list[int],
) -> None:
    views = [
        ReplicaView(rid, "x", queue_len=q, running=min(run, q), kv_cache_usage=kv)
        for rid, (q, run, kv) in zip("abcdefgh", replicas, strict=False)
    ]
    p = WeightedScorerPolicy(WeightedScorerParams(), rng=random.Random(0), clock=Clock())
    for blocks, rid in history:
        sent(p, blocks, rid)
    routing = RoutingInput(request(*prompt), views)
    parts = p.component_scores(routing)
    for scores in (parts.queue, parts.kv_cache, parts.prefix):
        assert len(scores) == len(views)
        assert all(0.0 <= s <= 1.0 for s in scores)
    totals = [
        2 * q + 2 * kv + 3 * px
        for q, kv, px in zip(parts.queue, parts.kv_cache, parts.prefix, strict=True)
    ]
    decision = p.choose(routing)
    assert -decision.winner.score == pytest.approx(max(totals))
    assert_well_ranked(decision, views)


def test_cache_aware_eviction_bounds_the_tree_and_keeps_the_recent() -> None:
    params = CacheAwareParams(max_tree_size_blocks=6, eviction_interval_s=0)
    p = CacheAwarePolicy(params, rng=random.Random(0), clock=Clock())
    prompts = [tuple(range(10 * k, 10 * k + 4)) for k in range(5)]
    for prompt in prompts:
        sent(p, prompt, "a")
        assert p.tree_size("a") <= 6
    assert p.tree_size("a") == 6
    cached = {
        k: choose(p, [replica("a")], *prompt).winner.cached_blocks
        for k, prompt in enumerate(prompts)
    }
    # least recently used leaves go first: the newest prompt whole, the one before it in part
    assert cached == {0: 0, 1: 0, 2: 0, 3: 2, 4: 4}


def test_prefix_tree_eviction_reports_how_many_blocks_it_dropped() -> None:
    tree = ApproxPrefixTree()
    tree.insert((1, 2, 3, 4), "a")
    tree.insert((1, 2, 9), "a")  # shares 1, 2: five blocks
    assert tree.evict("a", 5) == 0  # already within the target: nothing dropped
    assert tree.evict("nobody", 0) == 0  # never routed to
    assert tree.evict("a", 3) == 2  # the two least recently used leaves, 4 and 3
    assert tree.size("a") == 3
    assert tree.match((1, 2, 3, 4)) == {"a": 2}
    tree.insert((10, 11, 12), "b")
    tree.insert((20, 21), "b")
    # The oldest leaf (12) and every other block of its insertion go together.
    assert tree.evict("b", 4, whole_insertions=True) == 3
    assert (tree.size("b"), tree.match((10, 11)), tree.match((20, 21))) == (2, {}, {"b": 2})


def test_cache_aware_evicts_only_when_the_interval_has_passed() -> None:
    clock = Clock()
    params = CacheAwareParams(max_tree_size_blocks=4, eviction_interval_s=30)
    p = CacheAwarePolicy(params, rng=random.Random(0), clock=clock)
    for k in range(3):
        sent(p, range(10 * k, 10 * k + 4), "a")
    assert p.tree_size("a") == 12
    clock.now = 30.0
    sent(p, (7, 8), "b")
    assert p.tree_size("a") == 4


def test_prefix_affinity_evicts_whole_prompts_only_when_enabled() -> None:
    prompts = [tuple(range(10 * k, 10 * k + 4)) for k in range(3)]
    sizes = {}
    for interval in (None, 0.0):
        params = PrefixAffinityParams(
            eviction_interval_s=interval, eviction_threshold_blocks=8, eviction_target_blocks=5
        )
        p = PrefixAffinityPolicy(params, rng=random.Random(0), clock=Clock())
        for prompt in prompts:
            sent(p, prompt, "a")
        sizes[interval] = p.tree_size("a")
    # 12 > 8: the two oldest prompts go whole (a block-wise LRU would stop at 5)
    assert sizes == {None: 12, 0.0: 4}


def test_weighted_scorer_index_is_lru_bounded_per_replica() -> None:
    params = WeightedScorerParams(lru_capacity_blocks=6)
    p = WeightedScorerPolicy(params, rng=random.Random(0), clock=Clock())
    prompts = [tuple(range(10 * k, 10 * k + 4)) for k in range(3)]
    for prompt in prompts:
        sent(p, prompt, "a")
        sent(p, prompt[:1], "b")
    assert (p.indexed_blocks("a"), p.indexed_blocks("b")) == (6, 3)
    credited = [choose(p, [replica("a"), replica("b")], *pr).ranked for pr in prompts]
    assert [{c.replica_id: c.cached_blocks for c in ranked} for ranked in credited] == [
        {"a": 0, "b": 1}, {"a": 0, "b": 1}, {"a": 4, "b": 1},
    ]  # fmt: skip


@pytest.mark.parametrize("name", policy_names())
def test_every_registered_policy_builds_with_defaults_and_ranks_every_candidate(name: str) -> None:
    p = build_policy(name, {})
    assert p.name == name
    replicas = [replica(f"r{i}", q, kv=i / 10) for i, q in enumerate([4, 0, 7, 2, 2])]
    for _ in range(3):
        decision = choose(p, replicas, 1, 2, 3)
        p.on_routed(request(1, 2, 3), decision.winner)
        assert decision.policy == name
        assert decision.reason
        assert sorted(c.replica_id for c in decision.ranked) == sorted(
            x.replica_id for x in replicas
        )


@pytest.mark.parametrize("name", policy_names())
def test_an_unknown_parameter_is_rejected_by_name(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_policy(name, {"no_such_knob": 1})
    assert [p.path for p in info.value.problems] == ["router.params.no_such_knob"]


@pytest.mark.parametrize(
    ("name", "params", "path", "value"),
    [("cache_aware", {"cache_threshold": 1.5}, "router.params.cache_threshold", 1.5),
     ("weighted_scorer", {"prefix_weight": -1}, "router.params.prefix_weight", -1),
     ("prefix_affinity", {"eviction_threshold_blocks": 5, "eviction_target_blocks": 10},
      "router.params.eviction_target_blocks", 10)],
)  # fmt: skip
def test_an_out_of_bounds_parameter_is_rejected_with_its_value(
    name: str, params: dict[str, float], path: str, value: float
) -> None:
    with pytest.raises(ConfigError) as info:
        build_policy(name, params)
    [problem] = info.value.problems
    assert (problem.path, problem.value) == (path, value)


@pytest.mark.parametrize("name", BASELINES)
def test_every_parameter_is_frozen_documented_and_bounded(name: str) -> None:
    model = REGISTRY[name].params
    assert model.model_config.get("frozen") is True
    for field, info in model.model_fields.items():
        kinds = {type(m) for m in info.metadata}
        assert info.description, field
        assert kinds & {Ge, Gt}, field
        assert kinds & {Le, Lt}, field


@pytest.mark.parametrize(
    ("name", "defaults"),
    [("cache_aware", {"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5,
                      "eviction_interval_s": 120.0, "max_tree_size_blocks": 2**26}),
     ("prefix_affinity", {"imbalanced_threshold": 10, "match_rate_threshold": 0.1, "eviction_interval_s": None,
                          "eviction_threshold_blocks": 400_000, "eviction_target_blocks": 360_000}),
     ("weighted_scorer", {"queue_weight": 2.0, "kv_cache_weight": 2.0, "prefix_weight": 3.0,
                          "max_prefix_blocks": 256, "lru_capacity_blocks": 31_250}),
     ("llmd_sticky", {"affinity_threshold": 0.8, "exploration_probability": 0.0, "max_ttft_penalty_ms": 18_000.0,
                      "peak_prefill_tokens_per_s": 15_928.0, "queue_threshold_tokens": 4_194_304}),
     ("dynamo_kv", {"overlap_score_credit": 1.0, "prefill_load_scale": 1.0})],
)  # fmt: skip
def test_defaults_are_the_published_ones(name: str, defaults: dict[str, object]) -> None:
    assert REGISTRY[name].params().model_dump() == defaults


def test_platform_policies_are_exactly_the_configurable_ones() -> None:
    assert set(policy_names()) == set(typing.get_args(PolicyName))


@pytest.mark.parametrize("name", policy_names())
def test_a_policy_says_whether_its_decisions_predict_ttft(name: str) -> None:
    """The region decision uses a policy as its own estimate only if it says so."""
    p = policy(name)
    replicas = [ReplicaView("a", "us-east", 1), ReplicaView("b", "us-east", 0)]
    decision = choose(p, replicas, 1, 2)
    assert (decision.winner.terms is not None) is p.predicts_ttft


# --- edges a mutation run found untested (docs/development.md, mutation testing) -------


def test_an_explanation_gives_the_runner_up_its_margin_over_the_winner() -> None:
    from firstlight.routing import Candidate, Decision

    decision = Decision(
        "least_queue", (Candidate("a", "here", 12.0), Candidate("b", "here", 30.5)), "queue"
    )
    assert decision.explain() == "least_queue: a (queue); runner-up b +18.5"


@pytest.mark.parametrize(
    ("name", "params"),
    [("llmd_sticky", {"affinity_threshold": 1.5}),  # a fraction of the prompt: at most 1
     ("llmd_sticky", {"exploration_probability": 1.0000001}),  # a probability: at most 1
     ("weighted_scorer", {"max_prefix_blocks": 0}),
     ("cache_aware", {"balance_abs_threshold": 1_000_001})],
)  # fmt: skip
def test_a_parameter_just_past_its_published_range_is_refused(
    name: str, params: dict[str, float]
) -> None:
    with pytest.raises(ConfigError) as info:
        build_policy(name, params)
    [(field, value)] = params.items()
    [problem] = info.value.problems
    assert (problem.path, problem.value) == (f"router.params.{field}", value)


@pytest.mark.parametrize(
    ("name", "params"),
    [("llmd_sticky", {"affinity_threshold": 1.0}),
     ("llmd_sticky", {"exploration_probability": 1.0}),
     ("weighted_scorer", {"max_prefix_blocks": 1}),
     ("cache_aware", {"balance_abs_threshold": 1_000_000})],
)  # fmt: skip
def test_a_parameter_at_the_edge_of_its_range_is_taken(name: str, params: dict[str, float]) -> None:
    assert build_policy(name, params).name == name


def test_dynamo_kv_loads_a_worker_with_only_the_uncached_part_of_a_routed_prompt() -> None:
    from firstlight.routing import Candidate
    from firstlight.routing.baselines.dynamo_kv import DynamoKvPolicy

    policy = build_policy("dynamo_kv", {})
    assert isinstance(policy, DynamoKvPolicy)
    request = RequestView("q1", 640, block_hashes=tuple(range(20)), block_size=32)
    policy.on_routed(request, Candidate("a", "here", 0.0, cached_blocks=16))
    assert policy.in_flight.prefill_tokens("a") == 640 - 16 * 32


@pytest.mark.parametrize("name", ["cache_aware", "prefix_affinity"])
def test_a_prefix_match_scores_each_candidate_one_minus_its_match_rate(name: str) -> None:
    """The score the ranking shows is ``1 - matched / prompt blocks`` (lower is better):
    all four blocks held scores 0, two of four 0.5, none 1."""
    p = policy(name)
    sent(p, (1, 2, 3, 4), "a")
    sent(p, (1, 2), "b")
    decision = choose(p, [replica("c"), replica("b"), replica("a")], 1, 2, 3, 4)
    assert decision.reason == "prefix-match"
    assert [(c.replica_id, c.cached_blocks, c.score) for c in decision.ranked] == [
        ("a", 4, 0.0), ("b", 2, 0.5), ("c", 0, 1.0),
    ]  # fmt: skip


def test_weighted_scorer_draws_only_to_break_a_tie() -> None:
    """Equal best scores go to one seeded draw among the tied (the EPP's shuffle); a
    clear winner takes no draw, so the draws of the ties that follow are unchanged."""
    tied = [replica("a"), replica("b"), replica("c", kv=0.5)]  # a, b: 2 + 2; c: 2 + 1
    clear = [replica("a", kv=0.5), replica("b"), replica("c", kv=0.5)]
    p = policy("weighted_scorer", seed=4)
    mirror = random.Random(4)
    winners, expected = [], []
    for k in range(40):
        if k % 3 == 0:
            winners.append(choose(p, clear, 1).winner.replica_id)
            expected.append("b")
        else:
            winners.append(choose(p, tied, 1).winner.replica_id)
            expected.append("ab"[mirror.randrange(2)])
    assert winners == expected
    assert {w for k, w in enumerate(winners) if k % 3} == {"a", "b"}
