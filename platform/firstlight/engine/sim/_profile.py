"""What one simulated engine step costs, and the limits of one simulated model on one
device: :class:`SimProfile`.

A step of vLLM's continuous batching computes some prefill tokens and one token for each
decoding sequence; the simulator prices it as::

    step_ms = step_overhead_ms
            + prefill_tokens x prefill_ms_per_token
            + prefill_context x prefill_ms_per_token_per_context
            + decode_seqs x decode_ms_per_seq

plus, with a host tier (``host_kv_blocks``, vLLM's KV offloading), ``reloaded tokens x
reload_ms_per_token`` for the host-tier blocks the step's new requests reload instead of
prefilling them (:class:`~firstlight.engine.sim.SimCore`).

``step_overhead_ms`` is the cost of a step with one decoding sequence and nothing else
(weights streamed once, kernel launches, sampling); the other terms grow with the
batch. ``prefill_context`` is attention's share of a prefill: a chunk of a prompt computed
at positions ``[s, e)`` attends to ``s`` cached tokens and to itself, and adds
``(e² - s²) / 2`` to it (:meth:`SimProfile.prefill_context`), so a chunk of a long prompt
costs more than the same number of tokens at its start.

The built-in profiles, registered by name, are in :mod:`firstlight.engine.sim.profiles`,
which re-exports :class:`SimProfile`. :class:`~firstlight.engine.sim.SimCore` prices each
step with :meth:`SimProfile.step_ms`; the benchmark's ``floor`` reference asks
:meth:`SimProfile.lone_ttft_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from firstlight.errors import ConfigError, ConfigProblem

__all__ = ["SimProfile"]


@dataclass(frozen=True, slots=True)
class SimProfile:
    """Costs and limits of one simulated model on one device.

    Raises :class:`~firstlight.errors.ConfigError` naming the field when a value is out
    of range (every number must be positive, ``prefill_ms_per_token_per_context`` may be
    zero; the KV cache must hold one longest request).
    """

    name: str
    """Registry name, e.g. ``h100-llama-8b``; shown wherever the simulator reports."""
    description: str
    """One line: model, device, and where the numbers come from."""
    step_overhead_ms: float
    """Fixed cost of every step, milliseconds."""
    prefill_ms_per_token: float
    """Cost of each prefill token computed in a step, milliseconds (1000 / prefill rate)."""
    decode_ms_per_seq: float
    """Extra cost of each decoding sequence in a step, milliseconds."""
    max_num_batched_tokens: int
    """Token budget of one step (vLLM's ``max_num_batched_tokens``)."""
    max_num_seqs: int
    """Most requests running at once (vLLM's ``max_num_seqs``)."""
    block_size: int
    """Tokens per KV-cache block, also the block size of prefix-cache hints."""
    kv_cache_blocks: int
    """KV-cache capacity in blocks of ``block_size`` tokens."""
    max_model_len: int
    """Longest prompt + completion in tokens."""
    prefill_ms_per_token_per_context: float = 0.0
    """Extra cost of a prefill token per token it attends to, milliseconds (attention):
    multiplies a step's ``prefill_context``. ``0`` (the default) prices every prefill
    token alike, wherever it sits in its prompt; at least ``0``."""
    host_kv_blocks: int = 0
    """Host tier of the KV cache in blocks (vLLM's KV offloading): device evictions are
    kept there, least recently offloaded dropped first, and reloaded on a prefix hit.
    ``0`` (the default, every built-in profile): no host tier, evictions are dropped."""
    reload_ms_per_token: float = 0.0
    """Cost of reloading one token's KV from the host tier to the device, milliseconds:
    the model's KV bytes per token over the host-to-device bandwidth (a stated rate, not
    a measurement). Only used with ``host_kv_blocks``; at least ``0``."""
    kv_bytes_per_token: int = 0
    """Bytes of KV cache one token holds (layers x KV heads x head dims x 2 for K and V
    x bytes per value, over the replica's whole tensor-parallel group): what moving a
    cached prefix between sites costs (the benchmark's KV pull across regions). ``0``:
    unknown, such a prefix cannot be priced; at least ``0``."""

    def __post_init__(self) -> None:
        problems = [
            ConfigProblem(f.name, "must be positive", getattr(self, f.name), True)
            for f in fields(self)
            if f.type in ("int", "float")
            and f.name not in _NON_NEGATIVE
            and not getattr(self, f.name) > 0
        ]
        problems += [
            ConfigProblem(name, "must be zero or positive", getattr(self, name), True)
            for name in _NON_NEGATIVE
            if not getattr(self, name) >= 0
        ]
        if not problems and self.kv_cache_blocks * self.block_size < self.max_model_len:
            problems.append(
                ConfigProblem(
                    "kv_cache_blocks",
                    f"{self.kv_cache_blocks} blocks of {self.block_size} tokens cannot hold "
                    f"one request of max_model_len = {self.max_model_len} tokens",
                    self.kv_cache_blocks,
                    True,
                )
            )
        if problems:
            raise ConfigError(problems, source=f"simulator profile {self.name!r}")

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prefill throughput of the token term alone (no step overhead)."""
        return 1000.0 / self.prefill_ms_per_token

    @property
    def kv_cache_tokens(self) -> int:
        """KV-cache capacity in tokens."""
        return self.kv_cache_blocks * self.block_size

    @staticmethod
    def prefill_context(start: int, tokens: int) -> float:
        """Context of a prefill chunk of ``tokens`` tokens at positions ``[start, end)``:
        ``(end² - start²) / 2``, the tokens each of them attends to, summed (to within
        half a token each)."""
        return tokens * (2 * start + tokens) / 2

    def prefill_ms(self, start: int, tokens: int) -> float:
        """Cost of a prefill chunk of ``tokens`` tokens from position ``start`` on,
        milliseconds, without the step's overhead."""
        return (
            tokens * self.prefill_ms_per_token
            + self.prefill_context(start, tokens) * self.prefill_ms_per_token_per_context
        )

    def step_ms(self, prefill_tokens: int, decode_seqs: int, prefill_context: float = 0.0) -> float:
        """Duration of one step, milliseconds (the formula in the module docstring);
        ``prefill_context`` is the sum of :meth:`prefill_context` over the step's chunks."""
        return (
            self.step_overhead_ms
            + prefill_tokens * self.prefill_ms_per_token
            + prefill_context * self.prefill_ms_per_token_per_context
            + decode_seqs * self.decode_ms_per_seq
        )

    def lone_ttft_ms(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """Time to first token of a request alone on an idle replica, milliseconds: its
        uncached prompt (at least the last block: a cache hit covers at most
        ``(prompt_tokens - 1) // block_size`` blocks, as in vLLM) in chunks of
        ``max_num_batched_tokens``, one step each; the first token comes with the last.

        The benchmark's ``floor`` reference (:mod:`firstlight_bench.simulator.floor`). Raises
        ``ValueError`` for a prompt of no tokens or a cached count outside it."""
        if prompt_tokens < 1 or not 0 <= cached_tokens <= prompt_tokens:
            raise ValueError(f"{cached_tokens} cached of a {prompt_tokens}-token prompt")
        start = min(cached_tokens, (prompt_tokens - 1) // self.block_size * self.block_size)
        total = 0.0
        while start < prompt_tokens:
            n = min(prompt_tokens - start, self.max_num_batched_tokens)
            total += self.step_ms(n, 0, self.prefill_context(start, n))
            start += n
        return total


_NON_NEGATIVE = (
    "prefill_ms_per_token_per_context",
    "host_kv_blocks",
    "reload_ms_per_token",
    "kv_bytes_per_token",
)
"""Number fields of :class:`SimProfile` that may be zero."""
