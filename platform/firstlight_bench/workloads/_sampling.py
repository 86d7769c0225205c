"""Seeded random streams and the samplers the workload generators share.

Every generator draws content (prompts, lengths, groups) and arrivals from *separate*
streams, so the content never depends on the rate. Arrivals are drawn in normalized
time ``u`` (mean gap 1) and divided by the rate at the end, so another rate only
rescales the arrival times. All functions are pure given their ``random.Random``.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
import struct
from collections.abc import Sequence

__all__ = [
    "client_regions",
    "draw_rank",
    "exponential_gaps",
    "gamma_gaps",
    "jittered_length",
    "random_tokens",
    "skip_tokens",
    "stream",
    "zipf_cumulative_weights",
]


def stream(seed: int, purpose: str) -> random.Random:
    """A ``random.Random`` for one purpose (``"content"``, ``"arrivals"``, ...).

    Seeded from SHA-256 of ``(seed, purpose)``, not Python's ``hash()`` (salted per
    process), so a trace is identical across processes and machines.
    """
    digest = hashlib.sha256(f"firstlight-workload/{seed}/{purpose}".encode()).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


def random_tokens(rng: random.Random, count: int, vocab_size: int) -> tuple[int, ...]:
    """``count`` uniform token ids in ``1..vocab_size-1`` (0 is left out: often padding).

    Drawn 32 bits at a time in bulk; the modulo bias is below ``vocab_size / 2**32``.
    """
    words = struct.unpack(f"<{count}I", rng.randbytes(4 * count))
    span = vocab_size - 1
    return tuple(1 + word % span for word in words)


def skip_tokens(rng: random.Random, count: int) -> None:
    """Draw what :func:`random_tokens` would for ``count`` tokens, building none: the
    stream moves on exactly as far (a trace's left-out turns must not shift the rest)."""
    rng.getrandbits(32 * count)  # randbytes(4 * count) is this draw, then to_bytes


def jittered_length(rng: random.Random, mean: int, spread: float) -> int:
    """A length uniform in ``mean * (1 ± spread)`` (rounded, at least 1).

    The same number, from the same draws, as ``rng.randint(low, high)`` (CPython's
    ``randrange`` → ``_randbelow``: rejection sampling on ``getrandbits``), without its
    layers of argument checks: a long multi-turn trace draws millions of these."""
    low = max(1, round(mean * (1 - spread)))
    high = max(low, round(mean * (1 + spread)))
    width = high - low + 1
    bits = width.bit_length()
    draw = rng.getrandbits(bits)
    while draw >= width:
        draw = rng.getrandbits(bits)
    return low + draw


def exponential_gaps(rng: random.Random, count: int) -> list[float]:
    """Cumulative arrival times (normalized) of a Poisson process with rate 1."""
    return list(itertools.accumulate(rng.expovariate(1.0) for _ in range(count)))


def gamma_gaps(rng: random.Random, count: int, shape: float) -> list[float]:
    """Cumulative arrival times (normalized) with Gamma(shape) gaps of mean 1, so the
    gaps' coefficient of variation is ``1 / sqrt(shape)``."""
    return list(itertools.accumulate(rng.gammavariate(shape, 1 / shape) for _ in range(count)))


def zipf_cumulative_weights(count: int, exponent: float) -> Sequence[float]:
    """Cumulative weights of ranks ``0..count-1`` with weight ``1 / (rank+1)**exponent``;
    draw a rank with :func:`draw_rank`."""
    return list(itertools.accumulate(1 / (rank + 1) ** exponent for rank in range(count)))


def draw_rank(rng: random.Random, cumulative: Sequence[float]) -> int:
    """A rank drawn from the cumulative weights made by :func:`zipf_cumulative_weights`."""
    return bisect.bisect_right(cumulative, rng.random() * cumulative[-1])


def client_regions(seed: int, count: int, regions: int) -> list[int]:
    """Uniform client regions for workloads without a regional pattern (all 0 for one
    region), from their own stream so the prompts do not depend on ``regions``."""
    if regions == 1:
        return [0] * count
    rng = stream(seed, "regions")
    return [rng.randrange(regions) for _ in range(count)]
