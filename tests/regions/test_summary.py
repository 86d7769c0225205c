"""Region summaries: the JSON a region publishes, what a peer predicts from it, hot prefixes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from firstlight.regions.summary import (
    ForwardedWork,
    HotPrefixes,
    ModelSummary,
    RegionSummary,
    estimate_peer,
    leading_blocks,
    predict_peer_ttft,
    spills_over,
)
from firstlight.routing import Candidate, Decision, RequestView, TtftTerms

SUMMARY = RegionSummary(
    "eu-west",
    1_700_000_000.25,
    {
        "SmolLM2": ModelSummary(
            2, 41.5, 0.25, frozenset({7, 3, 2**64 - 1}), measured=True, mean_wait_ms=60.0
        ),
        "down-model": ModelSummary(0, 0.0, 1.0),
    },
)


def test_to_json_is_plain_json_with_sorted_hot_blocks() -> None:
    data = SUMMARY.to_json()
    assert data == {
        "region": "eu-west",
        "at": 1_700_000_000.25,
        "models": {
            "SmolLM2": {
                "healthy_replicas": 2,
                "predicted_wait_ms": 41.5,
                "prefill_ms_per_token": 0.25,
                "hot_blocks": [3, 7, 2**64 - 1],
                "measured": True,
                "mean_wait_ms": 60.0,
                "step_ms": None,
                "kv_used_blocks": None,
                "kv_total_blocks": None,
                "mean_queue_len": None,
            },
            "down-model": {
                "healthy_replicas": 0,
                "predicted_wait_ms": 0.0,
                "prefill_ms_per_token": 1.0,
                "hot_blocks": [],
                "measured": False,
                "mean_wait_ms": None,
                "step_ms": None,
                "kv_used_blocks": None,
                "kv_total_blocks": None,
                "mean_queue_len": None,
            },
        },
    }
    assert json.loads(json.dumps(data)) == data


def test_summary_round_trips_through_json_text() -> None:
    parsed = RegionSummary.from_json(json.loads(json.dumps(SUMMARY.to_json())))
    assert parsed == SUMMARY
    assert parsed.models["SmolLM2"].hot_blocks == frozenset({3, 7, 2**64 - 1})


def test_from_json_defaults_hot_blocks_and_ignores_unknown_fields() -> None:
    data = {
        "region": "ap-south",
        "at": 5,
        "version": 2,
        "models": {
            "m": {
                "healthy_replicas": 1,
                "predicted_wait_ms": 3,
                "prefill_ms_per_token": 2,
                "gpu": "x",
            }
        },
    }
    parsed = RegionSummary.from_json(data)
    assert parsed == RegionSummary("ap-south", 5.0, {"m": ModelSummary(1, 3.0, 2.0, frozenset())})
    assert isinstance(parsed.at, float)


def _good_model() -> dict[str, Any]:
    return {"healthy_replicas": 1, "predicted_wait_ms": 1.0, "prefill_ms_per_token": 0.1}


MALFORMED: list[tuple[str, Any]] = [
    ("null", None),
    ("list", [1, 2]),
    ("no-models", {"region": "eu", "at": 1.0}),
    ("models-not-object", {"region": "eu", "at": 1.0, "models": []}),
    ("no-region", {"at": 1.0, "models": {}}),
    ("no-at", {"region": "eu", "models": {}}),
    ("at-not-number", {"region": "eu", "at": "yesterday", "models": {}}),
    ("at-null", {"region": "eu", "at": None, "models": {}}),
    ("model-missing-field", {"region": "eu", "at": 1.0, "models": {"m": {"healthy_replicas": 1}}}),
    ("model-not-object", {"region": "eu", "at": 1.0, "models": {"m": [1, 2, 3]}}),
    (
        "replicas-not-int",
        {"region": "eu", "at": 1.0, "models": {"m": {**_good_model(), "healthy_replicas": "two"}}},
    ),
    (
        "hot-blocks-not-list",
        {"region": "eu", "at": 1.0, "models": {"m": {**_good_model(), "hot_blocks": 5}}},
    ),
    (
        "hot-block-not-int",
        {"region": "eu", "at": 1.0, "models": {"m": {**_good_model(), "hot_blocks": ["x"]}}},
    ),
    (
        "hot-block-nan",
        {
            "region": "eu",
            "at": 1.0,
            "models": {"m": {**_good_model(), "hot_blocks": [float("nan")]}},
        },
    ),
    # json.loads reads a peer's `Infinity` as a float; int() of it raises OverflowError
    (
        "replicas-infinite",
        {
            "region": "eu",
            "at": 1.0,
            "models": {"m": {**_good_model(), "healthy_replicas": float("inf")}},
        },
    ),
    (
        "hot-block-infinite",
        {
            "region": "eu",
            "at": 1.0,
            "models": {"m": {**_good_model(), "hot_blocks": [float("inf")]}},
        },
    ),
]


@pytest.mark.parametrize(
    "data", [case for _, case in MALFORMED], ids=[name for name, _ in MALFORMED]
)
def test_from_json_refuses_malformed_summaries(data: Any) -> None:
    # The peer table catches exactly these three when it parses a probe's answer.
    with pytest.raises((ValueError, KeyError, TypeError)):
        RegionSummary.from_json(data)


HOT = ModelSummary(
    healthy_replicas=1,
    predicted_wait_ms=30.0,
    prefill_ms_per_token=0.5,
    hot_blocks=frozenset({10, 11, 12}),
)

# (id, block hashes, prompt tokens, rtt, expected ms); block size 32
PREDICTIONS = [
    ("nothing-hot", (1, 2, 3), 100, 50.0, 50 + 30 + 100 * 0.5),
    ("two-leading-blocks-hot", (10, 11, 99), 100, 50.0, 50 + 30 + (100 - 64) * 0.5),
    ("hot-but-not-leading", (99, 10, 11), 100, 50.0, 50 + 30 + 100 * 0.5),
    ("chain-stops-at-first-miss", (10, 99, 11), 100, 50.0, 50 + 30 + (100 - 32) * 0.5),
    ("partial-last-block", (10, 11, 12), 100, 50.0, 50 + 30 + 4 * 0.5),
    ("fully-cached-still-one-token", (10, 11, 12), 96, 50.0, 50 + 30 + 1 * 0.5),
    ("no-blocks", (), 10, 0.0, 30 + 10 * 0.5),
    ("rtt-adds-linearly", (1,), 10, 217.0, 217 + 30 + 10 * 0.5),
]


@pytest.mark.parametrize(
    ("blocks", "prompt_tokens", "rtt_ms", "expected"),
    [case[1:] for case in PREDICTIONS],
    ids=[case[0] for case in PREDICTIONS],
)
def test_predict_peer_ttft(
    blocks: tuple[int, ...], prompt_tokens: int, rtt_ms: float, expected: float
) -> None:
    request = RequestView("q", prompt_tokens, block_hashes=blocks, block_size=32)
    assert predict_peer_ttft(HOT, request, rtt_ms) == pytest.approx(expected)


def test_predict_peer_ttft_uses_the_request_block_size() -> None:
    request = RequestView("q", 100, block_hashes=(10, 11), block_size=16)
    assert predict_peer_ttft(HOT, request, 0.0) == pytest.approx(30 + (100 - 32) * 0.5)


def test_hot_prefixes_start_empty() -> None:
    assert HotPrefixes().snapshot() == frozenset()


def test_hot_prefixes_evict_the_least_recently_added() -> None:
    hot = HotPrefixes(capacity=3)
    hot.add([1, 2, 3])
    hot.add([1])  # refreshed: 2 is now the oldest
    hot.add([4])
    assert hot.snapshot() == frozenset({1, 3, 4})
    hot.add([5, 6])
    assert hot.snapshot() == frozenset({4, 5, 6})


def test_hot_prefixes_keep_the_last_blocks_of_an_oversized_batch() -> None:
    hot = HotPrefixes(capacity=2)
    hot.add(range(10))
    assert hot.snapshot() == frozenset({8, 9})


def test_hot_prefixes_snapshot_is_a_copy() -> None:
    hot = HotPrefixes(capacity=4)
    hot.add([1, 2])
    before = hot.snapshot()
    hot.add([3])
    assert before == frozenset({1, 2})
    assert hot.snapshot() == frozenset({1, 2, 3})


def test_hot_prefixes_default_capacity_is_bounded() -> None:
    hot = HotPrefixes()
    hot.add(range(100_000))
    snapshot = hot.snapshot()
    assert 0 < len(snapshot) < 100_000
    assert 99_999 in snapshot
    assert 0 not in snapshot


def test_unmeasured_peer_is_predicted_at_the_local_rate() -> None:
    """An idle peer that never measured its prefill rate must not look faster than
    the local region just because its prior is optimistic."""
    request = RequestView("r", 1000, (), 32)
    unmeasured = ModelSummary(1, 10.0, 0.2, measured=False)
    measured = ModelSummary(1, 10.0, 0.2, measured=True)
    # Wait (10 ms of queued work at 0.2 ms/token = 50 tokens) and prefill at 2 ms/token.
    assert predict_peer_ttft(unmeasured, request, 40.0, 2.0) == pytest.approx(40 + 100 + 2000)
    assert predict_peer_ttft(measured, request, 40.0, 2.0) == pytest.approx(40 + 10 + 200)
    assert predict_peer_ttft(unmeasured, request, 40.0) == pytest.approx(40 + 10 + 200)


def test_forwarded_backlog_raises_the_peer_prediction() -> None:
    # 2 healthy replicas, 0.5 ms/token: 1,000 forwarded tokens add 250 ms.
    summary = ModelSummary(2, predicted_wait_ms=10.0, prefill_ms_per_token=0.5, measured=True)
    request = RequestView("q", prompt_tokens=100, block_size=32)
    quiet = predict_peer_ttft(summary, request, 40.0)
    assert quiet == pytest.approx(40 + 10 + 100 * 0.5)
    busy = predict_peer_ttft(summary, request, 40.0, forwarded_tokens=1000)
    assert busy - quiet == pytest.approx(250.0)


def _local(score_ms: float, ttft_ms: float | None) -> Decision:
    terms = None if ttft_ms is None else TtftTerms(0.0, 0.0, ttft_ms - 5.0, 5.0, 0, 100)
    return Decision("firstlight", (Candidate("r1", "us-east", score_ms, terms),), "test")


@pytest.mark.parametrize(
    ("local", "peer_ms", "spills"),
    [
        (_local(400.0, 400.0), 300.0, True),  # the peer wins by 100 ms > 50 ms margin
        (_local(400.0, 400.0), 360.0, False),  # inside the margin: stay
        # The score carries a 300 ms affinity penalty (ranking only); the request is
        # served locally in 100 ms, so a 300 ms peer must not take it.
        (_local(400.0, 100.0), 300.0, False),
        (_local(400.0, None), 10.0, False),  # no prediction: no reason to leave
        (None, 10.0, False),
        (_local(400.0, 400.0), None, False),  # no usable peer
    ],
    ids=["peer-faster", "within-margin", "penalty-is-no-ttft", "no-terms", "no-local", "no-peer"],
)
def test_spills_over_compares_predicted_ttfts(
    local: Decision | None, peer_ms: float | None, spills: bool
) -> None:
    assert spills_over(local, peer_ms, margin_ms=50.0) is spills


def test_forwarded_work_counts_what_was_sent_until_its_answer_starts() -> None:
    work = ForwardedWork()
    work.sent("a", 100)
    work.sent("b", 50)
    assert (work.tokens, len(work)) == (150, 2)
    work.sent("a", 120)  # the same request sent again (a retry): counted once
    assert work.tokens == 170
    work.answered("a")
    assert work.tokens == 50
    work.answered("a")  # twice, or never sent: nothing
    work.answered("zzz")
    assert work.tokens == 50
    work.reset()  # a new summary shows whatever was still queued
    assert (work.tokens, len(work)) == (0, 0)
    work.answered("b")
    assert work.tokens == 0


def test_a_summary_round_trips_its_step() -> None:
    summary = RegionSummary("r", 1.0, {"m": ModelSummary(1, 40.0, 0.5, step_ms=21.5)})
    assert RegionSummary.from_json(summary.to_json()).models["m"].step_ms == 21.5


def test_forwarded_blocks_stay_charged_after_the_answer_starts_until_the_next_summary() -> None:
    work = ForwardedWork()
    work.sent("a", 100, 4)
    work.sent("b", 50, 2)
    work.sent("a", 100, 4)  # a retry: counted once
    assert work.blocks == 6
    work.answered("a")  # it decodes there, holding its cache: still charged
    assert (work.tokens, work.blocks) == (50, 6)
    work.reset()  # the peer's summary now counts them in its KV usage
    assert work.blocks == 0


def test_kv_usage_counts_the_request_and_what_was_forwarded_since_the_summary() -> None:
    summary = ModelSummary(
        2, 10.0, 1.0, frozenset({1, 2}), True, kv_used_blocks=50, kv_total_blocks=100
    )
    request = RequestView("q", 100, (1, 2, 3), 32)  # 4 blocks, the first 2 hot there
    assert estimate_peer(summary, request, 0.0).kv_usage == pytest.approx((50 + 2) / 100)
    assert estimate_peer(summary, request, 0.0, forwarded_blocks=10).kv_usage == pytest.approx(0.62)
    assert estimate_peer(ModelSummary(2, 10.0, 1.0), request, 0.0).kv_usage is None
    round_trip = RegionSummary.from_json(RegionSummary("r", 1.0, {"m": summary}).to_json())
    assert round_trip.models["m"] == summary


def test_hot_prefixes_count_the_leading_blocks_served_recently() -> None:
    hot = HotPrefixes()
    hot.add([1, 2, 3])
    assert leading_blocks([1, 2, 9, 3], hot.snapshot()) == 2
    assert leading_blocks([9, 1], hot.snapshot()) == 0
    assert leading_blocks([], hot.snapshot()) == 0


def test_a_summary_round_trips_its_mean_queue_length() -> None:
    summary = RegionSummary("r", 1.0, {"m": ModelSummary(1, 40.0, 0.5, mean_queue_len=2.5)})
    assert RegionSummary.from_json(summary.to_json()).models["m"].mean_queue_len == 2.5


def test_a_long_prompt_keeps_its_first_blocks_then_landmarks_and_its_last() -> None:
    hot = HotPrefixes()
    prompt = list(range(1000, 1100))  # 100 blocks
    hot.add(prompt)
    kept = sorted(hot.snapshot())
    expected = prompt[:16] + [prompt[i] for i in (31, 47, 63, 79, 95)] + [prompt[99]]
    assert kept == expected
    assert leading_blocks(prompt, hot.snapshot()) == 100  # its own prompt: every block


def test_landmarks_stand_for_the_prefix_up_to_them_and_stop_at_a_missing_one() -> None:
    shared = list(range(50))  # chained hashes: a shared block means a shared prefix
    hot = HotPrefixes()
    hot.add([*shared, 7001, 7002])
    # Diverging after block 49: the last landmark before it is block 47.
    assert leading_blocks(shared + [9000 + i for i in range(30)], hot.snapshot()) == 48
    # Diverging inside the dense head: exact.
    assert leading_blocks([0, 1, 2, 9999, *shared[4:]], hot.snapshot()) == 3
    # Nothing shared.
    assert leading_blocks([9005, 9006], hot.snapshot()) == 0


def test_a_peer_reads_a_long_cached_prefix_from_its_landmarks() -> None:
    prompt = tuple(range(2000, 2750))  # 750 blocks: 12,000 tokens
    hot = HotPrefixes()
    hot.add(prompt)
    assert len(hot.snapshot()) == 16 + 45 + 1  # blocks 0-15, 31, 47, ..., 735, 749
    summary = ModelSummary(1, 10.0, 0.01, hot.snapshot(), measured=True)
    request = RequestView("next-turn", 12_800, prompt + tuple(range(5000, 5050)), 16)
    estimate = estimate_peer(summary, request, 70.0)
    assert estimate.cached_tokens == 750 * 16
