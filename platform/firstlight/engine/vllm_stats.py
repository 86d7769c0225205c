"""vLLM's per-iteration statistics, kept for the replica's stats and the router.

:class:`StatsRecorder` is built by :meth:`firstlight.engine.vllm_engine.VllmEngine.create`,
which hands its :meth:`StatsRecorder.factory` to vLLM as a stat logger; vLLM then calls
``record`` after every engine iteration, and the engine reads the recorder's fields for
its :class:`~firstlight.engine.protocol.EngineStats`. Nothing is polled.
"""

from __future__ import annotations

from typing import Any

from firstlight.engine._steps import RecentSteps

__all__ = ["StatsRecorder"]

_EWMA_ALPHA = 0.2


class StatsRecorder:
    """Receives vLLM's per-iteration stats (a ``StatLoggerBase`` made by :meth:`factory`)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.spec_draft_tokens = 0
        self.spec_accepted_tokens = 0
        self.steps = RecentSteps()
        self.inter_token_latency_ms: float | None = None
        self._last_iteration_at: float | None = None

    def factory(self, vllm_config: Any, engine_index: int = 0) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        recorder = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                recorder.record(scheduler_stats, iteration_stats)

            def log_engine_initialized(self) -> None:
                pass

        return _Logger(vllm_config, engine_index)

    def record(self, scheduler: Any, iteration: Any) -> None:
        if iteration is not None:
            now = iteration.iteration_timestamp
            itl = iteration.inter_token_latencies_iter
            last = self._last_iteration_at
            computed = iteration.prompt_token_stats.computed
            if last is not None and now > last:
                # An iteration's duration is the gap since the previous one while the
                # engine is busy (vLLM reports only iterations with outputs).
                self.steps.record(computed, len(itl), now - last)
            elif last is None and computed and iteration.time_to_first_tokens_iter:
                # The first iteration after an idle gap has no previous one; the request
                # that woke the engine waited for nothing, so its time to first token
                # (from its arrival) is the prefill's duration, a slight overestimate.
                # Without this, sequential traffic never measures a prefill and the
                # router prices every prompt at the configured default rate.
                self.steps.record(computed, len(itl), min(iteration.time_to_first_tokens_iter))
            self._last_iteration_at = now
            if itl:
                mean_ms = 1000 * sum(itl) / len(itl)
                self.inter_token_latency_ms = _ewma(self.inter_token_latency_ms, mean_ms)
        if scheduler is not None:
            self.running = scheduler.num_running_reqs
            self.waiting = scheduler.num_waiting_reqs
            self.kv_cache_usage = scheduler.kv_cache_usage
            self.prefix_queries += scheduler.prefix_cache_stats.queries
            self.prefix_hits += scheduler.prefix_cache_stats.hits
            spec = getattr(scheduler, "spec_decoding_stats", None)
            if spec is not None:
                self.spec_draft_tokens += spec.num_draft_tokens
                self.spec_accepted_tokens += spec.num_accepted_tokens
            if not (self.running or self.waiting):
                # An idle gap must not count as a step, or an idle replica would look
                # slow to the router.
                self._last_iteration_at = None


def _ewma(previous: float | None, sample: float) -> float:
    return sample if previous is None else (1 - _EWMA_ALPHA) * previous + _EWMA_ALPHA * sample
