"""Simulator profiles: the registry, validation, and the calibration of the CPU profile
against the measurements it cites (replayed in virtual time)."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from typing import Any

import pytest

from firstlight.engine.protocol import GenerationRequest, SamplingSettings
from firstlight.engine.sim import (
    DEFAULT_PROFILE,
    PROFILES,
    SimCore,
    VirtualSim,
    VirtualStep,
    get_profile,
    profile_names,
)
from firstlight.engine.sim._filler import Filler
from firstlight.errors import ConfigError

H100 = PROFILES["h100-llama-8b"]
CPU = PROFILES["cpu-smollm2-135m"]


def test_the_registry_holds_the_built_in_profiles_by_name() -> None:
    assert profile_names() == ("h100-llama-8b", "cpu-smollm2-135m")
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
    assert caught.value.problems[0].value == value


def test_the_h100_profile_matches_the_benchmark_brief() -> None:
    assert H100.prefill_tokens_per_s == pytest.approx(55_000)
    small_batch_ms = H100.step_ms(0, 1)
    full_batch_ms = H100.step_ms(0, H100.max_num_seqs)
    assert 8 <= small_batch_ms <= 12
    assert 1.5 <= full_batch_ms / small_batch_ms <= 2.0
    assert (H100.max_num_batched_tokens, H100.max_num_seqs, H100.block_size) == (8192, 256, 16)


def replay_reference_run(seed: int) -> tuple[float, float]:
    """ENVIRONMENT.md's reference run: 20 random 256-token prompts, 32 output tokens,
    Poisson arrivals at 4 req/s. Returns median TTFT and median TPOT in ms."""
    rng = random.Random(seed)
    sim = VirtualSim(SimCore(CPU, record_events=False))
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}

    def record(steps: list[VirtualStep]) -> None:
        for step in steps:
            for request_id in step.result.first_token_ids:
                first[request_id] = step.end_s
            for done in step.result.finished:
                last[done.request_id] = step.end_s

    now_s = 0.0
    for i in range(20):
        now_s += rng.expovariate(4.0)
        record(sim.advance_to(now_s))
        prompt = tuple(rng.randrange(49_152) for _ in range(256))
        sim.add(GenerationRequest(f"r{i}", prompt, SamplingSettings(max_tokens=32)))
        arrival[f"r{i}"] = now_s
    record(sim.run_until_idle())
    ttft_ms = [(first[r] - arrival[r]) * 1000 for r in arrival]
    tpot_ms = [(last[r] - first[r]) * 1000 / 31 for r in arrival]
    return statistics.median(ttft_ms), statistics.median(tpot_ms)


def test_the_cpu_profile_reproduces_the_measured_reference_run() -> None:
    runs = [replay_reference_run(seed) for seed in range(20)]
    ttft_ms = statistics.median(r[0] for r in runs)
    tpot_ms = statistics.median(r[1] for r in runs)
    assert ttft_ms == pytest.approx(138, rel=0.10)  # measured median TTFT 138 ms
    assert tpot_ms == pytest.approx(57, rel=0.10)  # measured median TPOT 57 ms


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


def test_filler_cycles_through_every_word() -> None:
    filler = Filler(seed=0)
    offset = filler.offset("x")
    words = {filler.token_id(offset, position) for position in range(63)}
    assert len(words) == 63
    assert filler.offset("x") == Filler(seed=0).offset("x")
