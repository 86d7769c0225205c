"""Prefix-cache block hashing, byte for byte what vLLM computes.

vLLM's prefix cache (``enable_prefix_caching``) identifies each *full* block of
``block_size`` prompt tokens by a hash chained over everything before it::

    none_hash = H(str(seed))
    h_1 = H((none_hash, tokens[0:bs], extra_1))
    h_i = H((h_{i-1}, tokens[(i-1)*bs : i*bs], extra_i))

with ``H = sha256_cbor`` (SHA-256 of the canonical CBOR encoding), ``seed`` the engine's
``PYTHONHASHSEED``, and ``extra_i`` the block's extra keys: ``("lora", name, path)`` on
every block of a LoRA request, then ``("cache_salt", salt)`` on the first block only
(see ``vllm/v1/core/kv_cache_utils.py``: ``hash_block_tokens`` and
``generate_block_hash_extra_keys``). A salt therefore separates tenants: equal prompts
with different salts share no block.

vLLM's KV-cache events publish each hash as its low 64 bits (big-endian); hints use that
form (:func:`hint_hashes`), so hints computed here from a prompt and hints announced by
an engine agree exactly.

:class:`HashScheme` is the one shared setting: the gateway hashes with it, and the engine
adapter starts vLLM with :meth:`HashScheme.engine_args` and
:meth:`HashScheme.engine_env`. Pure functions, no I/O.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cbor2

from firstlight.config import HintsConfig, ModelConfig

__all__ = ["HASH_ALGORITHM", "HashScheme", "LoraKey", "block_hashes", "hint_hashes", "to_hint"]

HASH_ALGORITHM = "sha256_cbor"
"""vLLM's ``prefix_caching_hash_algo``: deterministic across processes and languages."""


@dataclass(frozen=True, slots=True)
class LoraKey:
    """Identity of a LoRA adapter as vLLM hashes it (name and path)."""

    name: str
    path: str


@dataclass(frozen=True, slots=True)
class HashScheme:
    """Block size and seed shared by an engine and every gateway that routes to it."""

    block_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")

    @classmethod
    def for_model(cls, model: ModelConfig, hints: HintsConfig) -> HashScheme:
        """The scheme of ``model`` (its block size, the platform's hash seed)."""
        return cls(block_size=model.block_size, seed=hints.hash_seed)

    def engine_args(self) -> dict[str, Any]:
        """vLLM engine arguments that make the engine hash exactly like this scheme."""
        return {
            "block_size": self.block_size,
            "enable_prefix_caching": True,
            "prefix_caching_hash_algo": HASH_ALGORITHM,
        }

    def engine_env(self) -> dict[str, str]:
        """Environment of the engine process (vLLM derives its first parent hash from it)."""
        return {"PYTHONHASHSEED": str(self.seed)}


@functools.lru_cache(maxsize=16)
def _none_hash(seed: int) -> bytes:
    return _sha256_cbor(str(seed))


def _sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def block_hashes(
    token_ids: Sequence[int],
    scheme: HashScheme,
    *,
    cache_salt: str | None = None,
    lora: LoraKey | None = None,
) -> list[bytes]:
    """Return the 32-byte hash of every full block of ``token_ids`` (a partial tail
    block is not cached by vLLM, so it has no hash).

    Called by the gateway once per request; about 3 µs per block.
    """
    size = scheme.block_size
    lora_keys: list[tuple[str, ...]] = [("lora", lora.name, lora.path)] if lora else []
    first_keys = lora_keys + ([("cache_salt", cache_salt)] if cache_salt else [])
    first_extra = tuple(first_keys) if first_keys else None
    other_extra = tuple(lora_keys) if lora_keys else None
    parent = _none_hash(scheme.seed)
    hashes: list[bytes] = []
    for start in range(0, len(token_ids) - size + 1, size):
        extra = first_extra if start == 0 else other_extra
        parent = _sha256_cbor((parent, tuple(token_ids[start : start + size]), extra))
        hashes.append(parent)
    return hashes


def to_hint(block_hash: bytes) -> int:
    """The 64-bit form vLLM's KV-cache events publish: the hash's low 8 bytes, big-endian."""
    return int.from_bytes(block_hash[-8:], "big")  # 8 bytes: already 64 bits


def hint_hashes(
    token_ids: Sequence[int],
    scheme: HashScheme,
    *,
    cache_salt: str | None = None,
    lora: LoraKey | None = None,
) -> tuple[int, ...]:
    """:func:`block_hashes` in hint form, ready for the hint mirror and the router."""
    return tuple(
        to_hint(h) for h in block_hashes(token_ids, scheme, cache_salt=cache_salt, lora=lora)
    )
