"""Reconnection backoff: bounded, growing, jittered."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstlight.errors import HintsError
from firstlight.hints import Backoff


@given(
    initial_s=st.floats(0.001, 1),
    growth=st.floats(1, 100),
    multiplier=st.floats(1, 10),
    jitter=st.floats(0, 1),
    attempt=st.integers(0, 10_000),
    seed=st.integers(0, 2**32),
)
def test_delays_stay_within_their_bounds(
    initial_s: float, growth: float, multiplier: float, jitter: float, attempt: int, seed: int
) -> None:
    backoff = Backoff(initial_s, initial_s * growth, multiplier, jitter)
    ceiling = min(backoff.max_s, initial_s * multiplier ** min(attempt, 64))
    delay = backoff.delay_s(attempt, random.Random(seed))
    assert (1 - jitter) * ceiling - 1e-12 <= delay <= ceiling <= backoff.max_s


def test_delays_grow_until_the_cap() -> None:
    backoff = Backoff(initial_s=0.1, max_s=1.0, multiplier=2.0, jitter=0.0)
    rng = random.Random(0)
    assert [backoff.delay_s(n, rng) for n in range(6)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"initial_s": 0}, "initial_s"),
        ({"initial_s": 2.0, "max_s": 1.0}, "max_s"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"multiplier": 11}, "multiplier"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
    ],
)
def test_bounds_are_checked(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(HintsError, match=field):
        Backoff(**kwargs)
