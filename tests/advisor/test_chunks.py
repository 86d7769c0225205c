"""Content-defined chunks: they tile the prompt, and equal content gives equal chunks
wherever it sits once a cut falls inside it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstlight.advisor import content_chunks

tokens = st.lists(st.integers(0, 49_151), max_size=400)


@settings(max_examples=200, deadline=None)
@given(tokens, st.sampled_from([3, 7, 15, 31]), st.integers(1, 12))
def test_chunks_tile_the_sequence(ids: list[int], mask: int, min_tokens: int) -> None:
    chunks = content_chunks(ids, mask=mask, min_tokens=min_tokens)
    assert [c.start for c in chunks] == [0, *(c.end for c in chunks[:-1])][: len(chunks)]
    assert (chunks[-1].end if chunks else 0) == len(ids)
    assert all(c.tokens >= min_tokens for c in chunks[:-1])
    assert all(c.digest == hash(tuple(ids[c.start : c.end])) for c in chunks)


@settings(max_examples=200, deadline=None)
@given(tokens, tokens, st.lists(st.integers(0, 49_151), min_size=50, max_size=400))
def test_after_a_common_cut_a_shared_run_gives_equal_chunks(
    head_a: list[int], head_b: list[int], shared: list[int]
) -> None:
    a = content_chunks(head_a + shared)
    b = content_chunks(head_b + shared)
    # Chunk ends as offsets into the shared run.
    ends_a = {c.end - len(head_a): c for c in a if c.start >= len(head_a)}
    ends_b = {c.end - len(head_b): c for c in b if c.start >= len(head_b)}
    cuts_a = {c.end - len(head_a) for c in a if c.end > len(head_a)}
    cuts_b = {c.end - len(head_b) for c in b if c.end > len(head_b)}
    common = sorted(cuts_a & cuts_b)
    if not common:
        return
    # From the first cut both make, every later chunk is the same content.
    after_a = [c.digest for end, c in sorted(ends_a.items()) if end > common[0]]
    after_b = [c.digest for end, c in sorted(ends_b.items()) if end > common[0]]
    assert after_a == after_b


def test_a_static_run_behind_different_lines_is_mostly_recognised() -> None:
    rng = random.Random(7)
    static = [rng.randrange(49_152) for _ in range(600)]
    digests_of = [
        {c.digest for c in content_chunks([rng.randrange(49_152) for _ in range(n)] + static)}
        for n in (5, 13, 40)
    ]
    reference = content_chunks(static)
    recurring = [c for c in reference if all(c.digest in d for d in digests_of)]
    # Only the chunk before the first cut inside the static run can differ.
    assert sum(c.tokens for c in recurring) >= len(static) - 2 * reference[0].tokens


@pytest.mark.parametrize(
    ("mask", "min_tokens", "field"), [(10, 8, "mask"), (-1, 8, "mask"), (15, 0, "min_tokens")]
)
def test_bad_parameters_are_refused_by_name(mask: int, min_tokens: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        content_chunks([1, 2, 3], mask=mask, min_tokens=min_tokens)
