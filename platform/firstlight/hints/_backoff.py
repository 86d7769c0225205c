"""Reconnection delays: bounded exponential backoff with jitter.

Used by the subscriber between attempts to reach Redis again; pure, so the bounds are
testable without sleeping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from firstlight.errors import HintsError

__all__ = ["Backoff"]

_MAX_DOUBLINGS = 64  # beyond this every delay is max_s anyway; avoids float overflow


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before reconnection attempt ``n`` (0-based): ``min(max_s, initial_s *
    multiplier**n)``, of which a random fraction up to ``jitter`` is taken off so many
    routers that lost the same Redis do not reconnect in lockstep.

    Raises :class:`HintsError` naming the field and value when a bound is out of range.
    """

    initial_s: float = 0.1
    """Delay before the first reconnection attempt, seconds (before jitter)."""
    max_s: float = 5.0
    """Upper bound of any delay, seconds."""
    multiplier: float = 2.0
    """Growth factor per failed attempt, in ``[1, 10]``."""
    jitter: float = 0.5
    """Largest fraction of the delay removed at random, in ``[0, 1]``."""

    def __post_init__(self) -> None:
        if not self.initial_s > 0:
            raise HintsError(f"initial_s = {self.initial_s!r}: must be > 0")
        if not self.max_s >= self.initial_s:
            raise HintsError(f"max_s = {self.max_s!r}: must be >= initial_s ({self.initial_s!r})")
        if not 1 <= self.multiplier <= 10:
            raise HintsError(f"multiplier = {self.multiplier!r}: must be in [1, 10]")
        if not 0 <= self.jitter <= 1:
            raise HintsError(f"jitter = {self.jitter!r}: must be in [0, 1]")

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt``; in ``[(1 - jitter) * d, d]`` where
        ``d = min(max_s, initial_s * multiplier**attempt)``."""
        ceiling = min(self.max_s, self.initial_s * self.multiplier ** min(attempt, _MAX_DOUBLINGS))
        return ceiling * (1.0 - self.jitter * rng.random())
