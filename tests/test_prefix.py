"""Block hashes must equal vLLM's own, computed by the installed vLLM on the same tokens."""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstlight.config import HintsConfig, ModelConfig
from firstlight.prefix import HashScheme, LoraKey, block_hashes, hint_hashes, to_hint

tokens_st = st.lists(st.integers(min_value=0, max_value=151_000), max_size=300)
salt_st = st.none() | st.text(min_size=1, max_size=12)
lora_st = st.none() | st.builds(LoraKey, st.text(min_size=1, max_size=8), st.just("/loras/a"))


def _vllm_block_hashes(
    tokens: list[int], block_size: int, seed: int, salt: str | None, lora: LoraKey | None
) -> list[bytes]:
    """vLLM's request block hasher, exactly as its scheduler runs it."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    previous = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = str(seed)
    try:
        kv_cache_utils.init_none_hash(sha256_cbor)
    finally:
        if previous is None:
            del os.environ["PYTHONHASHSEED"]
        else:
            os.environ["PYTHONHASHSEED"] = previous
    request = Request(
        request_id="r",
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        lora_request=LoRARequest(lora.name, 1, lora.path) if lora else None,
        cache_salt=salt,
        block_hasher=kv_cache_utils.get_request_block_hasher(block_size, sha256_cbor),
    )
    return list(request.block_hashes)


@settings(max_examples=60, deadline=None)
@given(
    tokens=tokens_st,
    block_size=st.sampled_from([16, 32, 64]),
    seed=st.integers(0, 2**32 - 1),
    salt=salt_st,
    lora=lora_st,
)
def test_hashes_equal_vllms(
    tokens: list[int], block_size: int, seed: int, salt: str | None, lora: LoraKey | None
) -> None:
    scheme = HashScheme(block_size=block_size, seed=seed)
    ours = block_hashes(tokens, scheme, cache_salt=salt, lora=lora)
    assert ours == _vllm_block_hashes(tokens, block_size, seed, salt, lora)
    assert len(ours) == len(tokens) // block_size


def test_hint_form_is_what_vllm_kv_events_publish() -> None:
    from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash

    scheme = HashScheme(block_size=32, seed=0)
    for full in block_hashes(list(range(100)), scheme):
        assert to_hint(full) == maybe_convert_block_hash(BlockHash(full))


@settings(max_examples=100, deadline=None)
@given(shared=tokens_st, tail_a=tokens_st, tail_b=tokens_st, salt=salt_st)
def test_shared_leading_blocks_give_equal_leading_hashes(
    shared: list[int], tail_a: list[int], tail_b: list[int], salt: str | None
) -> None:
    scheme = HashScheme(block_size=16, seed=7)
    a = hint_hashes(shared + tail_a, scheme, cache_salt=salt)
    b = hint_hashes(shared + tail_b, scheme, cache_salt=salt)
    full_shared_blocks = len(shared) // 16
    assert a[:full_shared_blocks] == b[:full_shared_blocks]


@settings(max_examples=50, deadline=None)
@given(tokens=st.lists(st.integers(0, 50_000), min_size=16, max_size=200))
def test_salt_and_seed_separate_every_block(tokens: list[int]) -> None:
    base = HashScheme(block_size=16, seed=0)
    plain = hint_hashes(tokens, base)
    salted = hint_hashes(tokens, base, cache_salt="tenant-a")
    other_tenant = hint_hashes(tokens, base, cache_salt="tenant-b")
    reseeded = hint_hashes(tokens, HashScheme(block_size=16, seed=1))
    for other in (salted, other_tenant, reseeded):
        assert not set(plain) & set(other)
    assert not set(salted) & set(other_tenant)


def test_partial_tail_block_has_no_hash() -> None:
    scheme = HashScheme(block_size=32, seed=0)
    assert block_hashes(list(range(31)), scheme) == []
    assert len(block_hashes(list(range(95)), scheme)) == 2


@pytest.mark.parametrize("blocks", [1, 2, 3, 8])
def test_a_prompt_of_whole_blocks_hashes_its_last_block(blocks: int) -> None:
    """A prompt whose length is an exact multiple of the block size: its last block is
    full and vLLM caches it (the property test's random lengths rarely land on one, and
    an off-by-one that dropped the last block passed it)."""
    tokens = [(7 * i) % 50_000 for i in range(32 * blocks)]
    ours = block_hashes(tokens, HashScheme(block_size=32, seed=3))
    assert len(ours) == blocks
    assert ours == _vllm_block_hashes(tokens, 32, 3, None, None)


@pytest.mark.parametrize(("block_size", "blocks"), [(1, 2), (3, 2), (3, 4), (5, 2)])
def test_whole_blocks_of_an_odd_block_size_are_all_hashed(block_size: int, blocks: int) -> None:
    """Whole blocks of an odd size: the property test draws only even sizes, and its
    random lengths rarely land on a whole number of blocks."""
    tokens = [(13 * i) % 50_000 for i in range(block_size * blocks)]
    ours = block_hashes(tokens, HashScheme(block_size=block_size, seed=5))
    assert len(ours) == blocks
    assert ours == _vllm_block_hashes(tokens, block_size, 5, None, None)


def test_scheme_is_the_shared_engine_setting() -> None:
    scheme = HashScheme.for_model(ModelConfig(name="m", block_size=64), HintsConfig(hash_seed=9))
    assert scheme == HashScheme(block_size=64, seed=9)
    assert scheme.engine_args() == {
        "block_size": 64,
        "enable_prefix_caching": True,
        "prefix_caching_hash_algo": "sha256_cbor",
    }
    assert scheme.engine_env() == {"PYTHONHASHSEED": "9"}


def test_a_scheme_and_a_lora_key_are_immutable_values() -> None:
    """A scheme is validated once, when built: it cannot be given a bad block size
    afterwards. Both are values: equal ones are one key of a mapping."""
    scheme = HashScheme(block_size=16, seed=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        scheme.block_size = 0  # type: ignore[misc]
    lora = LoraKey("adapter", "/loras/a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        lora.path = "/elsewhere"  # type: ignore[misc]
    schemes = {HashScheme(16, 0): "a", HashScheme(32, 0): "b", HashScheme(16, 0): "c"}
    assert schemes == {HashScheme(16, 0): "c", HashScheme(32, 0): "b"}
    assert len({lora, LoraKey("adapter", "/loras/a"), LoraKey("other", "/loras/a")}) == 2


@pytest.mark.parametrize("block_size", [0, -1, -16])
def test_block_size_must_be_positive(block_size: int) -> None:
    with pytest.raises(ValueError, match="block_size must be positive"):
        HashScheme(block_size=block_size, seed=0)


@pytest.mark.parametrize("lora", [None, LoraKey("adapter", "/loras/a")])
def test_a_salted_prompt_of_several_blocks_equals_vllms(lora: LoraKey | None) -> None:
    """vLLM puts the cache salt in the first block's extra keys only (the property test
    above rarely drew a salted prompt of several blocks: a salt in every block passed
    it)."""
    tokens = [(11 * i) % 50_000 for i in range(32 * 3 + 5)]
    ours = block_hashes(tokens, HashScheme(block_size=32, seed=0), cache_salt="tenant", lora=lora)
    assert ours == _vllm_block_hashes(tokens, 32, 0, "tenant", lora)
