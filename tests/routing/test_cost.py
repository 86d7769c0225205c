"""The cost model's terms, its monotonicity, calibration and reservations."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstlight.routing import (
    Calibrator,
    CostRates,
    ReplicaView,
    RequestView,
    Reservations,
    TtftTerms,
    predict_ttft,
)

RATES = CostRates(
    prefill_tokens_per_s=1000.0,
    step_overhead_ms=5.0,
    decode_ms_per_running_seq=0.5,
    mean_prompt_tokens=100,
    kv_full_fraction=1.0,  # slot wait only on a full KV cache: tested on its own below
)


def _request(tokens: int = 320, block_size: int = 32) -> RequestView:
    return RequestView("q", prompt_tokens=tokens, block_size=block_size)


def _replica(**fields: object) -> ReplicaView:
    values: dict[str, object] = {"replica_id": "r", "region": "us-east", "queue_len": 0}
    values.update(fields)
    return ReplicaView(**values)  # type: ignore[arg-type]


def test_worked_example_term_by_term() -> None:
    # 320-token prompt, 4 blocks (128 tokens) cached; 300 tokens queued; 2 decoding;
    # 1000 tokens/s → 1 ms per token.
    replica = _replica(queue_len=3, running=2, pending_prefill_tokens=300)
    terms = predict_ttft(
        _request(),
        replica,
        cached_blocks=4,
        rtt_ms=80.0,
        reserved_tokens=50,
        correction=1.0,
        rates=RATES,
    )
    assert terms.cached_tokens == 128
    assert terms.uncached_tokens == 192
    assert terms.wait_ms == pytest.approx(350.0)
    assert terms.prefill_ms == pytest.approx(192.0)
    assert terms.overhead_ms == pytest.approx(6.0)
    assert terms.total_ms == pytest.approx(80 + 350 + 192 + 6)
    assert terms.service_ms == pytest.approx(350 + 192 + 6)


def test_host_tier_tokens_cost_the_reload_rate_instead_of_prefill() -> None:
    # 320 tokens: 2 blocks (64 tokens) on device, the next 5 blocks (160) in host memory,
    # 96 recomputed; reload at 0.1 ms per token against 1 ms to prefill one.
    rates = dataclasses.replace(RATES, reload_ms_per_token=0.1)
    common = {"rtt_ms": 0.0, "reserved_tokens": 0, "correction": 2.0, "rates": rates}
    terms = predict_ttft(_request(), _replica(), cached_blocks=2, host_blocks=5, **common)  # type: ignore[arg-type]
    assert (terms.cached_tokens, terms.host_tokens, terms.uncached_tokens) == (64, 160, 96)
    assert terms.prefill_ms == pytest.approx(96 * 1.0 * 2.0)
    assert terms.reload_ms == pytest.approx(160 * 0.1 * 2.0), "corrected like the rest"
    assert terms.total_ms == pytest.approx(192 + 32 + terms.overhead_ms)
    miss = predict_ttft(_request(), _replica(), cached_blocks=2, **common)  # type: ignore[arg-type]
    assert (miss.host_tokens, miss.reload_ms, miss.uncached_tokens) == (0, 0.0, 256)
    assert terms.total_ms < miss.total_ms
    # A prompt all in host memory still computes its last token, as a device hit does.
    whole = predict_ttft(_request(), _replica(), cached_blocks=0, host_blocks=10, **common)  # type: ignore[arg-type]
    assert (whole.host_tokens, whole.uncached_tokens) == (319, 1)
    # Host blocks beyond the prompt are not reloaded.
    assert (
        predict_ttft(
            _request(),
            _replica(),
            cached_blocks=9,
            host_blocks=5,
            **common,  # type: ignore[arg-type]
        ).host_tokens
        == 31
    )


def test_queue_length_stands_in_for_unreported_prefill_work() -> None:
    replica = _replica(queue_len=5, running=2)
    terms = predict_ttft(
        _request(), replica, cached_blocks=0, rtt_ms=0, reserved_tokens=0, correction=1, rates=RATES
    )
    assert terms.wait_ms == pytest.approx(3 * 100 * 1.0)


def test_full_cache_hit_still_computes_one_token_and_uses_the_measured_rate() -> None:
    replica = _replica(prefill_tokens_per_s=4000.0)
    terms = predict_ttft(
        _request(),
        replica,
        cached_blocks=99,
        rtt_ms=0,
        reserved_tokens=0,
        correction=2,
        rates=RATES,
    )
    assert terms.cached_tokens == 320
    assert terms.uncached_tokens == 1
    assert terms.prefill_ms == pytest.approx(1 * 0.25 * 2)
    assert terms.overhead_ms == pytest.approx(10.0)


work = st.integers(min_value=0, max_value=100_000)
blocks = st.integers(min_value=0, max_value=64)


@given(cached=blocks, more=st.integers(1, 64), queued=work, tokens=st.integers(1, 4096))
def test_more_cached_tokens_never_raise_predicted_ttft(
    cached: int, more: int, queued: int, tokens: int
) -> None:
    replica = _replica(pending_prefill_tokens=queued)

    def total(b: int) -> float:
        return predict_ttft(
            _request(tokens), replica, cached_blocks=b, rtt_ms=0, reserved_tokens=0,
            correction=1, rates=RATES,
        ).total_ms  # fmt: skip

    assert total(cached + more) <= total(cached)


@given(queued=work, extra=st.integers(1, 100_000), reserved=work, cached=blocks)
def test_more_queued_work_never_lowers_predicted_ttft(
    queued: int, extra: int, reserved: int, cached: int
) -> None:
    def total(q: int) -> float:
        return predict_ttft(
            _request(), _replica(pending_prefill_tokens=q), cached_blocks=cached, rtt_ms=0,
            reserved_tokens=reserved, correction=1, rates=RATES,
        ).total_ms  # fmt: skip

    assert total(queued + extra) >= total(queued)


def test_calibration_converges_to_the_observed_slowdown() -> None:
    calibrator = Calibrator(alpha=0.5, min_correction=0.25, max_correction=4.0)
    for _ in range(30):
        terms = predict_ttft(
            _request(), _replica(), cached_blocks=0, rtt_ms=20, reserved_tokens=0,
            correction=calibrator.correction("r"), rates=RATES,
        )  # fmt: skip
        truth_service_ms = 2 * (320 + 5)  # the replica is twice as slow as assumed
        calibrator.observe("r", terms, observed_ttft_ms=20 + truth_service_ms)
    assert calibrator.correction("r") == pytest.approx(2.0, rel=1e-3)
    error = calibrator.error_ms("r")
    assert error is not None
    assert abs(error) < 1.0
    assert calibrator.correction("other") == 1.0
    assert calibrator.error_ms("other") is None


def test_the_prediction_error_is_an_ewma_of_observed_minus_predicted() -> None:
    # Predicted 100 ms each time; errors of +100, +20, 0 and -40 ms. With alpha 0.25 the
    # first observation seeds the average, each later one moves it a quarter of the way.
    calibrator = Calibrator(alpha=0.25, min_correction=0.25, max_correction=4.0)
    terms = TtftTerms(0.0, 0.0, 100.0, 0.0, cached_tokens=0, uncached_tokens=100)
    assert terms.total_ms == 100.0
    smoothed = []
    for observed in (200.0, 120.0, 100.0, 60.0):
        calibrator.observe("r", terms, observed_ttft_ms=observed)
        smoothed.append(calibrator.error_ms("r"))
    # 100; 0.75 * 100 + 0.25 * 20 = 80; 0.75 * 80 = 60; 0.75 * 60 + 0.25 * -40 = 35
    assert smoothed == pytest.approx([100.0, 80.0, 60.0, 35.0])


def test_calibration_is_clamped_and_forgettable() -> None:
    calibrator = Calibrator(alpha=1.0, min_correction=0.5, max_correction=3.0)
    terms = predict_ttft(
        _request(), _replica(), cached_blocks=0, rtt_ms=0, reserved_tokens=0, correction=1,
        rates=RATES,
    )  # fmt: skip
    calibrator.observe("r", terms, observed_ttft_ms=1e9)
    assert calibrator.correction("r") == 3.0
    calibrator.observe("r", terms, observed_ttft_ms=0)
    assert calibrator.correction("r") == 0.5
    calibrator.forget("r")
    assert calibrator.correction("r") == 1.0


def test_calibrator_rejects_a_bad_alpha() -> None:
    with pytest.raises(ValueError, match="alpha"):
        Calibrator(alpha=0, min_correction=0.5, max_correction=2)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reservations_count_only_after_the_stats_snapshot_and_expire() -> None:
    clock = Clock()
    reservations = Reservations(ttl_s=10, clock=clock)
    reservations.reserve("r1", "a", 100)
    clock.now = 101.0
    reservations.reserve("r1", "b", 50)
    assert reservations.amount_after("r1", since=0) == 150
    assert reservations.amount_after("r1", since=100.5) == 50  # "a" is in the stats already
    assert reservations.amount_after("r2", since=0) == 0
    reservations.release("a")
    assert reservations.amount_after("r1", since=0) == 50
    clock.now = 200.0
    assert reservations.amount_after("r1", since=0) == 0
    assert len(reservations) == 0


def test_rereserving_a_request_moves_it() -> None:
    reservations = Reservations(ttl_s=10, clock=Clock())
    reservations.reserve("r1", "a", 100)
    reservations.reserve("r2", "a", 70)
    assert reservations.amount_after("r1", since=0) == 0
    assert reservations.amount_after("r2", since=0) == 70


def test_slot_wait_prices_requests_waiting_for_kv_memory() -> None:
    # 3 waiting behind 2 running, then this request; a departure every 128 steps x
    # (5 + 2 x 0.5) ms / 2 running = 384 ms, so 4 x 384 ms; only from kv_full_fraction on.
    rates = CostRates(1000.0, 5.0, 0.5, 100, mean_output_tokens=128, kv_full_fraction=0.9)
    full = _replica(
        queue_len=5, running=2, waiting=3, pending_prefill_tokens=0, kv_cache_usage=0.95
    )
    roomy = _replica(
        queue_len=5, running=2, waiting=3, pending_prefill_tokens=0, kv_cache_usage=0.5
    )
    # Ray's queue length may count requests the engine no longer holds: only the
    # engine's own waiting count is used; on a full replica this request still waits.
    nobody = _replica(
        queue_len=3, running=2, waiting=0, pending_prefill_tokens=0, kv_cache_usage=0.99
    )

    def wait(replica: ReplicaView) -> float:
        return predict_ttft(
            _request(), replica, cached_blocks=0, rtt_ms=0, reserved_tokens=0, correction=2,
            rates=rates,
        ).wait_ms  # fmt: skip

    assert wait(full) == pytest.approx(4 * 384.0 * 2)  # the correction applies too
    assert wait(roomy) == 0.0
    assert wait(nobody) == pytest.approx(1 * 384.0 * 2)


# --- the memory wait: replicas that report their KV capacity ------------------------

MEMORY_RATES = CostRates(1000.0, 5.0, 0.5, 100, mean_output_tokens=128)


def _memory_wait(replica: ReplicaView, tokens: int = 320, age_ms: float = 0.0) -> float:
    return predict_ttft(
        _request(tokens), replica, cached_blocks=0, rtt_ms=0, reserved_tokens=0,
        correction=1.0, rates=MEMORY_RATES, stats_age_ms=age_ms,
    ).wait_ms  # fmt: skip


def test_memory_wait_counts_the_blocks_spoken_for_against_the_capacity() -> None:
    # 1000 blocks of 32, 90 % in use, 640 queued tokens (20 blocks), 4 requests at the
    # stats and now; this request needs (320 + 128) / 32 = 14 blocks: 934 of 1000, fits.
    base = {"kv_cache_blocks": 1000, "running": 3, "waiting": 1, "queue_len": 4, "step_ms": 10.0}
    roomy = _replica(kv_cache_usage=0.9, pending_prefill_tokens=640, **base)
    assert _memory_wait(roomy) == pytest.approx(640 * 1.0)  # only the queued prefill
    # 97 %: 970 + 20 + 14 = 1004 blocks, 4 short: 4 / 1000 of a lifetime (128 x 10 ms).
    full = _replica(kv_cache_usage=0.97, pending_prefill_tokens=640, **base)
    assert _memory_wait(full) == pytest.approx(640 + 4 / 1000 * 1280)


def test_memory_wait_follows_the_live_queue_length_and_the_growth_since_the_stats() -> None:
    # At the stats: 4 requests holding 800 blocks, 200 each. Two finished since: 400 free.
    stats = {"kv_cache_blocks": 1000, "running": 4, "waiting": 0, "kv_cache_usage": 0.8}
    stats.update(step_ms=10.0, pending_prefill_tokens=0)
    assert _memory_wait(_replica(queue_len=2, **stats)) == 0.0
    # Three more arrived since: 1400 blocks of 1000 + 14, one lifetime x 414 / 1000.
    assert _memory_wait(_replica(queue_len=7, **stats)) == pytest.approx(414 / 1000 * 1280)
    # Unchanged count, but half a second old: 4 running grew 50 tokens each (6.25 blocks).
    grown = _memory_wait(_replica(queue_len=4, **stats), age_ms=500.0)
    assert grown == 0.0  # 800 + 6.25 + 14 fits
    crowded = dict(stats, kv_cache_usage=0.98)
    assert _memory_wait(_replica(queue_len=4, **crowded), age_ms=500.0) == pytest.approx(
        (980 + 6.25 + 14 - 1000) / 1000 * 1280
    )


def test_a_replica_without_a_capacity_falls_back_to_the_slot_wait() -> None:
    rates = CostRates(1000.0, 5.0, 0.5, 100, mean_output_tokens=128, kv_full_fraction=0.9)
    replica = _replica(
        queue_len=5, running=2, waiting=3, pending_prefill_tokens=0, kv_cache_usage=0.95
    )
    terms = predict_ttft(
        _request(), replica, cached_blocks=0, rtt_ms=0, reserved_tokens=0, correction=1.0,
        rates=rates,
    )  # fmt: skip
    assert terms.wait_ms == pytest.approx(4 * 384.0)


def test_a_replica_without_a_prefill_count_holds_a_mean_prompt_per_waiting_request() -> None:
    # No pending_prefill_tokens reported: each of the 2 waiting requests stands for the
    # mean prompt (100 tokens), 200 tokens in all, in the queue term (200 ms at 1 ms a
    # token) and in the memory term: 990 + 200 / 32 = 996.25 blocks held and queued,
    # plus this request's 14 on 1000: 10.25 short, 10.25 / 1000 of a lifetime (128 x
    # 10 ms). The same as when the replica reports those 200 tokens itself.
    stats: dict[str, float] = {"kv_cache_blocks": 1000, "running": 2, "waiting": 2}
    stats.update(queue_len=4, kv_cache_usage=0.99, step_ms=10.0)
    unreported = _memory_wait(_replica(**stats))
    assert unreported == pytest.approx(200.0 + 10.25 / 1000 * 1280)
    assert unreported == pytest.approx(_memory_wait(_replica(pending_prefill_tokens=200, **stats)))
