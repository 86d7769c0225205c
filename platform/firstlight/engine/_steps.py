"""Recent engine steps, turned into the two rates a router prices requests with.

Used by both engines: :class:`~firstlight.engine.sim.SimCore` records every simulated
step, :class:`~firstlight.engine.vllm_engine.VllmEngine` every vLLM iteration. Running
sums keep each read O(1): the benchmark reads every replica's stats on every decision.

A step's duration is a fixed part (the forward pass of the batch's decoding sequences,
sampling, scheduling) plus the marginal cost of the prompt tokens it prefills. The cost
model prices a request as ``uncached tokens / prefill rate + one step``, so the rate it
needs is the *marginal* one. Dividing prefill tokens by whole step durations (what this
module did before) folds the fixed part into the rate: after a few short prompts a
replica looked two to three times slower per token than it is (28 tokens in a 69 ms step
read as 405 tokens/s where the marginal rate is ~860), and long prompts were sent away
from it. Here the fixed part is the recent decode-only step, measured on the same engine.
"""

from __future__ import annotations

from collections import deque

__all__ = ["RecentSteps"]

_MIN_MARGINAL_SHARE = 0.05
"""Below this share of the prefill steps' time left once the fixed part is taken out, the
estimate is noise (steps that prefilled a token or two): report the gross rate instead."""


class RecentSteps:
    """The last ``size`` steps that prefilled, that decoded, and that only decoded."""

    __slots__ = (
        "_decode",
        "_decode_only",
        "_prefill",
        "_prefill_s",
        "_prefill_tokens",
        "_size",
    )

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._prefill: deque[tuple[int, float]] = deque()
        self._prefill_tokens = 0
        self._prefill_s = 0.0
        self._decode = _Durations(size)
        self._decode_only = _Durations(size)

    def record(self, prefill_tokens: int, decode_seqs: int, duration_s: float) -> None:
        """Count one finished step that computed ``prefill_tokens`` prompt tokens and
        sampled for ``decode_seqs`` sequences already decoding."""
        if prefill_tokens:
            if len(self._prefill) == self._size:
                old_tokens, old_s = self._prefill.popleft()
                self._prefill_tokens -= old_tokens
                self._prefill_s -= old_s
            self._prefill.append((prefill_tokens, duration_s))
            self._prefill_tokens += prefill_tokens
            self._prefill_s += duration_s
        if decode_seqs:
            self._decode.add(duration_s)
            if not prefill_tokens:
                self._decode_only.add(duration_s)

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """Marginal prefill throughput: the recent prefill steps' tokens over the time
        they added to their steps (each step's duration less :attr:`step_ms`).
        The gross rate while no decode-only step was seen, or when too little time is
        left to measure; ``None`` before any prefill step."""
        if not self._prefill:
            return None
        gross_s = self._prefill_s
        net_s = gross_s
        fixed_s = self._decode_only.mean_s
        if fixed_s is not None:
            net_s -= len(self._prefill) * fixed_s
        if net_s < _MIN_MARGINAL_SHARE * gross_s:
            net_s = gross_s
        return self._prefill_tokens / net_s

    @property
    def step_ms(self) -> float | None:
        """Mean duration of the recent steps that only decoded, milliseconds: the fixed
        cost of a step, which the step that emits a first token pays on top of its
        prefill. ``None`` before the first such step."""
        mean_s = self._decode_only.mean_s
        return None if mean_s is None else mean_s * 1000.0

    @property
    def inter_token_latency_ms(self) -> float | None:
        """Mean duration of the recent steps that decoded (prefill chunks they shared
        included), milliseconds; ``None`` before the first one."""
        mean_s = self._decode.mean_s
        return None if mean_s is None else mean_s * 1000.0


class _Durations:
    """The last ``size`` durations and their sum."""

    __slots__ = ("_size", "_sum_s", "_values")

    def __init__(self, size: int) -> None:
        self._size = size
        self._values: deque[float] = deque()
        self._sum_s = 0.0

    def add(self, duration_s: float) -> None:
        if len(self._values) == self._size:
            self._sum_s -= self._values.popleft()
        self._values.append(duration_s)
        self._sum_s += duration_s

    @property
    def mean_s(self) -> float | None:
        return self._sum_s / len(self._values) if self._values else None
