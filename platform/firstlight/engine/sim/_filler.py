"""Deterministic filler output: the simulator's "generated" tokens.

Token ids and text depend only on (seed, request id, position), so the same seed replays
the same trace in any process. The words are plain English filler and the ids are not a
real tokenizer's: the output is obviously simulated. Called by :class:`SimCore` once
per sampled token (:meth:`Filler.token_id`) and by :class:`SimEngine` for the text.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

__all__ = ["Filler"]

_VOCABULARY = (
    "simulated lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod "
    "tempor incididunt ut labore et dolore magna aliqua enim ad minim veniam quis "
    "nostrud exercitation ullamco laboris nisi aliquip ex ea commodo consequat duis "
    "aute irure in reprehenderit voluptate velit esse cillum fugiat nulla pariatur "
    "excepteur sint occaecat cupidatat non proident sunt culpa qui officia deserunt "
    "mollit anim id est laborum"
)
"""The filler vocabulary, space-separated: 63 words, so ``_STRIDE`` must be coprime
with 63 (a test checks that every request cycles through all of them)."""

_FIRST_ID = 1000
"""Filler token ids are ``_FIRST_ID + word index`` (well inside any real vocabulary)."""

_STRIDE = 5
"""Words advance by this stride per position; coprime with the word count, so a request
walks through every word before repeating."""


class Filler:
    """Filler token ids and texts for one seed."""

    __slots__ = ("_count", "_seed", "_texts")

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._texts = tuple(" " + word for word in _VOCABULARY.split())
        self._count = len(self._texts)

    def offset(self, request_id: str, resumed_tokens: int = 0) -> int:
        """Where ``request_id`` starts in the word cycle (stable across processes); a
        request resumed after ``resumed_tokens`` outputs continues where it stopped."""
        start = zlib.crc32(f"{self._seed}/{request_id}".encode())
        return (start + resumed_tokens * _STRIDE) % self._count

    def token_id(self, offset: int, position: int) -> int:
        """Token id of output ``position`` of the request starting at ``offset``."""
        return _FIRST_ID + (offset + position * _STRIDE) % self._count

    def text(self, token_id: int) -> str:
        """Text of a filler token id (a space and a word)."""
        return self._texts[token_id - _FIRST_ID]

    def stop_token_ids(self, stop: Iterable[str]) -> frozenset[int]:
        """Filler tokens whose text contains one of the ``stop`` strings: sampling one
        ends the request with ``finish_reason="stop"`` (the string itself is not
        returned, as in vLLM)."""
        strings = [s for s in stop if s]
        return frozenset(
            _FIRST_ID + i for i, text in enumerate(self._texts) if any(s in text for s in strings)
        )
