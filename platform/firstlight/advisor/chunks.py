"""Content-defined chunks of a token sequence: equal content gives equal chunks wherever
it sits in a prompt.

vLLM's prefix-cache blocks are chained (each block's hash covers everything before it)
and cut at fixed offsets, so a static system prompt behind a variable first line shares
no block with the same system prompt behind another line. To see that two prompts agree
*later* we need pieces that do not depend on what came before or on where they start.
Chunks are cut where a hash of two neighbouring tokens has its low bits at zero (about
every ``1 / (mask + 1)`` tokens, never shorter than ``min_tokens``), as rsync and LBFS
cut files: a shift of the content by any number of tokens moves the cuts with it, so
after the first cut inside a shared run every chunk of the run recurs.

Called by :class:`~firstlight.advisor.ledger.PrefixAdvisor` once per observed request.
Pure; Python ints hash the same in every process (no ``PYTHONHASHSEED`` involved).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Chunk", "content_chunks"]

_MIX_A = 0x9E3779B1
_MIX_B = 0x85EBCA77
_MASK_64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Chunk:
    """``tokens[start:end]`` of a prompt, identified by its content alone."""

    start: int
    end: int
    digest: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


def content_chunks(
    tokens: Sequence[int], *, mask: int = 15, min_tokens: int = 8
) -> tuple[Chunk, ...]:
    """Cut ``tokens`` into content-defined chunks (the module docstring): a chunk ends
    after token ``i`` when ``mix(tokens[i-1], tokens[i]) & mask == 0`` and it holds at
    least ``min_tokens``; the last chunk ends with the sequence. Raises ``ValueError``
    unless ``mask + 1`` is a power of two and ``min_tokens`` ≥ 1."""
    if mask < 0 or mask & (mask + 1):
        raise ValueError(f"mask = {mask!r}: must be one less than a power of two")
    if min_tokens < 1:
        raise ValueError(f"min_tokens = {min_tokens!r}: must be at least 1")
    ids = list(tokens)
    chunks: list[Chunk] = []
    start = 0
    for i in range(1, len(ids)):
        mixed = ((ids[i - 1] * _MIX_A + ids[i] * _MIX_B) & _MASK_64) >> 17
        if mixed & mask == 0 and i + 1 - start >= min_tokens:
            chunks.append(Chunk(start, i + 1, hash(tuple(ids[start : i + 1]))))
            start = i + 1
    if start < len(ids):
        chunks.append(Chunk(start, len(ids), hash(tuple(ids[start:]))))
    return tuple(chunks)
