"""Recent-step rates for :meth:`SimCore.stats`, kept with running sums so a stats call
is O(1): the benchmark reads every replica's stats for every routing decision."""

from __future__ import annotations

from collections import deque

__all__ = ["RecentSteps"]


class RecentSteps:
    """The last ``size`` steps that prefilled and the last ``size`` that decoded."""

    __slots__ = ("_decode", "_decode_s", "_prefill", "_prefill_s", "_prefill_tokens", "_size")

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._prefill: deque[tuple[int, float]] = deque()
        self._prefill_tokens = 0
        self._prefill_s = 0.0
        self._decode: deque[float] = deque()
        self._decode_s = 0.0

    def record(self, prefill_tokens: int, decode_seqs: int, duration_s: float) -> None:
        """Count one finished step (called by :meth:`SimCore.finish_step`)."""
        if prefill_tokens:
            if len(self._prefill) == self._size:
                old_tokens, old_s = self._prefill.popleft()
                self._prefill_tokens -= old_tokens
                self._prefill_s -= old_s
            self._prefill.append((prefill_tokens, duration_s))
            self._prefill_tokens += prefill_tokens
            self._prefill_s += duration_s
        if decode_seqs:
            if len(self._decode) == self._size:
                self._decode_s -= self._decode.popleft()
            self._decode.append(duration_s)
            self._decode_s += duration_s

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """Prefill tokens over the duration of the steps that computed them (overhead and
        co-scheduled decodes included, as a real engine would measure it)."""
        return self._prefill_tokens / self._prefill_s if self._prefill else None

    @property
    def inter_token_latency_ms(self) -> float | None:
        """Mean duration of the recent decode steps, milliseconds."""
        return self._decode_s / len(self._decode) * 1000.0 if self._decode else None
