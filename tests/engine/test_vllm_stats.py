"""The vLLM engine's stat logger turns vLLM's own per-iteration stats (real
``IterationStats`` / ``SchedulerStats`` objects, filled as vLLM fills them) into the
prefill rate and step cost the router prices requests with."""

from __future__ import annotations

import pytest
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from firstlight.engine.vllm_stats import StatsRecorder


def _iteration(at: float, computed: int, ttfts: list[float], itls: list[float]) -> IterationStats:
    stats = IterationStats()
    stats.iteration_timestamp = at
    stats.prompt_token_stats.computed = computed
    stats.time_to_first_tokens_iter = list(ttfts)
    stats.inter_token_latencies_iter = list(itls)
    return stats


def _scheduler(running: int, waiting: int = 0) -> SchedulerStats:
    stats = SchedulerStats()
    stats.num_running_reqs = running
    stats.num_waiting_reqs = waiting
    return stats


def test_single_token_requests_on_an_idle_engine_measure_the_prefill_rate() -> None:
    recorder = StatsRecorder()
    at = 1000.0
    for _ in range(3):  # sequential one-token requests: each wakes an idle engine
        at += 5.0
        recorder.record(_scheduler(running=0), _iteration(at, 700, [0.5], []))
    # Each prefill took its request's time to first token: 700 tokens in 0.5 s.
    assert recorder.steps.prefill_tokens_per_s == pytest.approx(1400.0)


def test_while_busy_an_iteration_lasts_from_the_previous_one() -> None:
    recorder = StatsRecorder()
    recorder.record(_scheduler(running=1), _iteration(10.0, 64, [0.2], []))
    recorder.record(_scheduler(running=1), _iteration(10.05, 0, [], [0.05]))
    recorder.record(_scheduler(running=2), _iteration(10.15, 300, [0.1], [0.1]))
    assert recorder.steps.step_ms == pytest.approx(50.0)
    # 64 tokens in 0.2 s from idle (150 ms more than a step), then 300 in 100 ms (50 more).
    assert recorder.steps.prefill_tokens_per_s == pytest.approx(364 / (0.15 + 0.05))


def test_an_idle_gap_is_not_a_step() -> None:
    recorder = StatsRecorder()
    recorder.record(_scheduler(running=1), _iteration(10.0, 0, [], [0.05]))
    recorder.record(_scheduler(running=0), _iteration(10.05, 0, [], [0.05]))
    # Idle for a minute, then a decode-only iteration (no first token): nothing measured.
    recorder.record(_scheduler(running=1), _iteration(70.0, 0, [], [0.05]))
    assert recorder.steps.step_ms == pytest.approx(50.0)
    assert recorder.steps.prefill_tokens_per_s is None
