"""Recent steps → the marginal prefill rate and the fixed step cost both engines report."""

from __future__ import annotations

import pytest

from firstlight.engine._steps import RecentSteps


def test_nothing_measured_yet() -> None:
    steps = RecentSteps()
    assert (steps.prefill_tokens_per_s, steps.step_ms, steps.inter_token_latency_ms) == (
        None,
        None,
        None,
    )


def test_the_gross_rate_until_a_decode_only_step_shows_the_fixed_cost() -> None:
    steps = RecentSteps()
    steps.record(28, 0, 0.069)
    assert steps.prefill_tokens_per_s == pytest.approx(28 / 0.069)
    steps.record(0, 1, 0.037)
    steps.record(0, 1, 0.037)
    assert steps.step_ms == pytest.approx(37.0)
    # 28 tokens added 32 ms to a 37 ms step: ~875 tokens/s, not the 406 of the whole step.
    assert steps.prefill_tokens_per_s == pytest.approx(28 / 0.032)


def test_steps_of_different_sizes_give_one_marginal_rate() -> None:
    steps = RecentSteps()
    steps.record(0, 1, 0.010)
    for tokens in (16, 256, 2048):
        steps.record(tokens, 0, 0.010 + tokens / 50_000)
    assert steps.prefill_tokens_per_s == pytest.approx(50_000)


def test_mixed_steps_count_as_decode_latency_but_not_as_the_fixed_cost() -> None:
    steps = RecentSteps()
    steps.record(0, 4, 0.020)
    steps.record(500, 4, 0.060)
    assert steps.step_ms == pytest.approx(20.0)
    assert steps.inter_token_latency_ms == pytest.approx(40.0)
    assert steps.prefill_tokens_per_s == pytest.approx(500 / 0.040)


def test_noise_below_the_fixed_cost_falls_back_to_the_gross_rate() -> None:
    steps = RecentSteps()
    steps.record(0, 1, 0.040)
    steps.record(1, 0, 0.039)  # a one-token prefill that ran faster than a decode step
    assert steps.prefill_tokens_per_s == pytest.approx(1 / 0.039)


def test_the_windows_keep_only_the_last_steps() -> None:
    steps = RecentSteps(size=2)
    steps.record(0, 1, 0.100)
    for _ in range(2):
        steps.record(0, 1, 0.010)
    steps.record(100, 0, 1.0)
    for _ in range(2):
        steps.record(100, 0, 0.020)
    assert steps.step_ms == pytest.approx(10.0)
    assert steps.prefill_tokens_per_s == pytest.approx(200 / 0.020)
