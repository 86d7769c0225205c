"""Workloads W1-W6: determinism, rate independence, distributions, errors."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstlight.errors import ConfigError
from firstlight_bench.workloads import (
    WORKLOADS,
    TraceRequest,
    Workload,
    describe,
    generate,
    workload_names,
)
from firstlight_bench.workloads._sampling import jittered_length, skip_tokens

MOONCAKE_SAMPLE = Path(__file__).parent / "data" / "mooncake-synthetic.jsonl"
"""300 made-up requests in the Mooncake trace format (see data/README.md)."""
MOONCAKE_REAL = Path(__file__).parents[3] / "shared" / "traces" / "mooncake"

# Small content so the statistical tests stay fast; arrivals do not depend on it.
SMALL: dict[str, dict[str, Any]] = {
    "W1": {"system_tokens": 32, "question_tokens": 8},
    "W2": {"system_tokens": 16, "user_tokens": 8, "answer_tokens": 8},
    "W3": {"min_prompt_tokens": 32, "max_prompt_tokens": 64},
    "W4": {"system_tokens": 32, "question_tokens": 8},
    "W5": {"system_tokens": 32, "question_tokens": 8},
    "W6": {"system_tokens": 32, "question_tokens": 8},
    "W7": {"trace": str(MOONCAKE_SAMPLE)},
    "W8": {"system_tokens": 32, "question_tokens": 8},
}


def content(request: TraceRequest) -> tuple[object, ...]:
    """Everything but the id and the arrival time."""
    return (
        request.client_region,
        request.prompt,
        request.max_tokens,
        request.prefix_group,
        request.session,
        request.turn,
    )


def gaps(workload: Workload) -> list[float]:
    arrivals = [0.0] + [r.arrival_s for r in workload.requests]
    return [b - a for a, b in itertools.pairwise(arrivals)]


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


def test_registry_lists_w1_to_w8_with_described_parameters() -> None:
    assert workload_names() == ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8")
    for name, spec in WORKLOADS.items():
        text = describe(name)
        assert text.startswith(f"{name}: ")
        for field_name, info in spec.params.model_fields.items():
            assert info.description, f"{name}.{field_name} has no docstring"
            assert f"  {field_name} = " in text


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(workload_names()),
    seed=st.integers(-(2**63), 2**63),
    num_requests=st.integers(1, 30),
)
def test_same_seed_same_trace_other_seed_other_trace(
    name: str, seed: int, num_requests: int
) -> None:
    kwargs: dict[str, Any] = {"rate_rps": 5.0, "num_requests": num_requests, **SMALL[name]}
    first = generate(name, seed=seed, **kwargs)
    assert generate(name, seed=seed, **kwargs) == first
    assert generate(name, seed=seed + 1, **kwargs).requests != first.requests

    requests = first.requests
    assert len(requests) == num_requests
    assert len({r.request_id for r in requests}) == num_requests
    assert all(r.request_id.startswith(f"{name.lower()}-") for r in requests)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)
    assert all(0 <= r.client_region < first.regions for r in requests)
    assert all(r.max_tokens >= 1 and r.prompt for r in requests)
    json.dumps(first.params)  # recorded in results.json as is


@pytest.mark.parametrize("name", [n for n in workload_names() if n != "W2"])
def test_content_does_not_depend_on_the_rate(name: str) -> None:
    """(W2's think times are seconds: see the multi-turn tests; W6's wall-clock day is
    its own test, this one holds its normalized day.)"""
    params: dict[str, Any] = {**SMALL[name], **({"period_s": None} if name == "W6" else {})}
    slow = generate(name, seed=7, rate_rps=10, num_requests=300, **params)
    fast = generate(name, seed=7, rate_rps=100, num_requests=300, **params)
    assert [content(r) for r in fast.requests] == [content(r) for r in slow.requests]
    assert [r.request_id for r in fast.requests] == [r.request_id for r in slow.requests]
    for s, f in zip(slow.requests, fast.requests, strict=True):
        assert s.arrival_s == pytest.approx(10 * f.arrival_s, rel=1e-9)
    assert slow.with_rate(100) == fast


def test_client_regions_do_not_change_the_prompts() -> None:
    one = generate("W1", seed=3, rate_rps=10, num_requests=2000, **SMALL["W1"])
    three = generate("W1", seed=3, rate_rps=10, num_requests=2000, regions=3, **SMALL["W1"])
    assert [r.prompt for r in three.requests] == [r.prompt for r in one.requests]
    assert {r.client_region for r in one.requests} == {0}
    counts = Counter(r.client_region for r in three.requests)
    assert sorted(counts) == [0, 1, 2]
    assert all(abs(c - 2000 / 3) < 100 for c in counts.values())


def test_token_ids_stay_in_the_vocabulary() -> None:
    workload = generate("W3", seed=1, rate_rps=1, num_requests=50, vocab_size=5, **SMALL["W3"])
    assert {t for r in workload.requests for t in r.prompt} == {1, 2, 3, 4}


@pytest.mark.parametrize("name", ["W1", "W3", "W4"])
def test_poisson_arrivals_have_mean_gap_one_over_rate_and_cv_one(name: str) -> None:
    workload = generate(name, seed=11, rate_rps=20, num_requests=5000, **SMALL[name])
    intervals = gaps(workload)
    assert statistics.fmean(intervals) == pytest.approx(1 / 20, rel=0.05)
    assert cv(intervals) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_bursty_gaps_have_cv_one_over_sqrt_shape(burstiness: float) -> None:
    workload = generate(
        "W5", seed=5, rate_rps=20, num_requests=5000, burstiness=burstiness, **SMALL["W5"]
    )
    intervals = gaps(workload)
    assert statistics.fmean(intervals) == pytest.approx(1 / 20, rel=0.1)
    assert cv(intervals) == pytest.approx(1 / math.sqrt(burstiness), rel=0.15)


def test_bursty_content_is_w1_content() -> None:
    w1 = generate("W1", seed=9, rate_rps=10, num_requests=200, **SMALL["W1"])
    w5 = generate("W5", seed=9, rate_rps=10, num_requests=200, **SMALL["W5"])
    assert [content(r) for r in w5.requests] == [content(r) for r in w1.requests]


def test_shared_prefix_prompts_start_with_their_group_system_prompt() -> None:
    system_tokens = 48
    workload = generate(
        "W1",
        seed=2,
        rate_rps=10,
        num_requests=5000,
        system_tokens=system_tokens,
        question_tokens=16,
    )
    systems: dict[int | None, set[tuple[int, ...]]] = defaultdict(set)
    for r in workload.requests:
        systems[r.prefix_group].add(r.prompt[:system_tokens])
        assert 12 <= len(r.prompt) - system_tokens <= 20  # question: 16 +- 25%
        assert 96 <= r.max_tokens <= 160  # output: 128 +- 25%
    assert sorted(systems) == list(range(64))  # type: ignore[type-var]
    assert all(len(prompts) == 1 for prompts in systems.values())
    assert len({next(iter(prompts)) for prompts in systems.values()}) == 64
    assert workload.mean_output_tokens() == pytest.approx(128, rel=0.02)
    assert workload.mean_prompt_tokens() == pytest.approx(system_tokens + 16, rel=0.02)
    # Uniform groups: chi-square with 63 degrees of freedom (mean 63, sd 11).
    counts = Counter(r.prefix_group for r in workload.requests)
    expected = 5000 / 64
    chi_square = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi_square < 110


def test_zipf_groups_follow_zipf() -> None:
    workload = generate("W4", seed=4, rate_rps=10, num_requests=5000, **SMALL["W4"])
    counts = Counter(r.prefix_group for r in workload.requests)
    harmonic = sum(1 / k**1.1 for k in range(1, 257))
    assert counts[0] / 5000 == pytest.approx(1 / harmonic, rel=0.1)
    assert counts[0] / counts[1] == pytest.approx(2**1.1, rel=0.2)
    assert counts[0] > counts[1] > counts[3] > counts[15] > counts[63]
    assert set(counts) <= set(range(256))
    assert workload.params["derived"]["rank1_share"] == pytest.approx(1 / harmonic)


def test_multi_turn_prompts_extend_the_previous_turn_exactly() -> None:
    workload = generate("W2", seed=6, rate_rps=25, num_requests=2000, **SMALL["W2"])
    by_session: dict[int | None, list[TraceRequest]] = defaultdict(list)
    for r in workload.requests:  # arrival order
        by_session[r.session].append(r)
    assert len(by_session) == workload.params["derived"]["sessions"]
    system = workload.requests[0].prompt[:16]
    entered_late = 0
    for turns in by_session.values():
        first = turns[0].turn
        entered_late += first > 0
        # A window of the session: consecutive turns, from wherever the trace began.
        assert [r.turn for r in turns] == list(range(first, first + len(turns)))
        assert first + len(turns) <= 6
        assert turns[0].prompt[:16] == system
        assert all(r.prefix_group == 0 for r in turns)
        for previous, current in itertools.pairwise(turns):
            assert current.prompt[: len(previous.prompt)] == previous.prompt
            added = len(current.prompt) - len(previous.prompt)
            assert 6 + previous.max_tokens <= added <= 10 + previous.max_tokens  # answer + user
            assert current.arrival_s >= previous.arrival_s
    # Steady state: sessions already open at time 0 enter the trace at a later turn.
    assert entered_late > 0


def _turn_gaps(workload: Workload) -> list[float]:
    by_session: dict[int | None, list[float]] = defaultdict(list)
    for r in workload.requests:
        by_session[r.session].append(r.arrival_s)
    return [b - a for times in by_session.values() for a, b in itertools.pairwise(times)]


def test_multi_turn_runs_at_the_offered_rate_from_the_first_request() -> None:
    workload = generate("W2", seed=8, rate_rps=25, num_requests=6000, **SMALL["W2"])
    arrivals = [r.arrival_s for r in workload.requests]
    end = arrivals[-1]
    assert len(arrivals) / end == pytest.approx(25, rel=0.05)
    # No ramp: the first and the last quarter of the trace run at the same rate.
    first = sum(1 for t in arrivals if t < end / 4)
    last = sum(1 for t in arrivals if t >= 3 * end / 4)
    assert first / last == pytest.approx(1, abs=0.1)
    derived = workload.params["derived"]
    assert derived["open_sessions"] == pytest.approx(25 * 10 * 5 / 6)


@pytest.mark.parametrize(
    ("distribution", "cv_range"),
    [("exponential", (0.85, 1.15)), ("lognormal", (1.1, 1.5)), ("constant", (0.0, 1e-9))],
)
def test_multi_turn_think_times_are_seconds_whatever_the_rate(
    distribution: str, cv_range: tuple[float, float]
) -> None:
    # Sessions are short beside the trace (5 s against 80 s or more), so few gaps are
    # cut by its ends (a cut favours long gaps, biasing the observed mean down).
    params = {**SMALL["W2"], "think_s": 1.0, "think_distribution": distribution}
    for rate in (5.0, 50.0):
        workload = generate("W2", seed=3, rate_rps=rate, num_requests=4000, **params)
        think = _turn_gaps(workload)
        assert statistics.fmean(think) == pytest.approx(1.0, rel=0.08)
        # lognormal with sigma 1: CV = sqrt(e - 1) = 1.31
        low, high = cv_range
        assert low <= statistics.pstdev(think) / statistics.fmean(think) <= high


def test_multi_turn_sessions_keep_their_content_at_any_rate() -> None:
    slow = generate("W2", seed=4, rate_rps=5, num_requests=500, **SMALL["W2"])
    fast = generate("W2", seed=4, rate_rps=50, num_requests=500, **SMALL["W2"])
    prompts = {(r.session, r.turn): r.prompt for r in slow.requests}
    shared = [r for r in fast.requests if (r.session, r.turn) in prompts]
    assert shared  # the two windows overlap
    assert all(prompts[(r.session, r.turn)] == r.prompt for r in shared)
    assert slow.with_rate(50) == fast


def test_control_prompts_share_nothing() -> None:
    workload = generate("W3", seed=3, rate_rps=10, num_requests=2000, max_prompt_tokens=512)
    first_blocks = {r.prompt[:32] for r in workload.requests}
    assert len(first_blocks) == 2000
    assert all(r.prefix_group is None for r in workload.requests)
    assert all(256 <= len(r.prompt) <= 512 for r in workload.requests)
    assert all(32 <= r.max_tokens <= 256 for r in workload.requests)
    assert workload.mean_prompt_tokens() == pytest.approx(384, rel=0.03)


def test_multi_region_peaks_take_turns_at_3_2_times_the_neighbours() -> None:
    regions, n, rate = 4, 40_000, 40.0
    workload = generate("W6", seed=12, rate_rps=rate, num_requests=n, period_s=None, **SMALL["W6"])
    assert workload.regions == regions
    period = workload.params["derived"]["period_s"]
    assert period == pytest.approx(n / rate)
    assert n / workload.requests[-1].arrival_s == pytest.approx(rate, rel=0.05)

    # Counts per (region, slice of the day): region r peaks in slice r. Over a slice a
    # raised cosine from 0.5 to 1.6 averages 1.05, so a region sends 2.1x in its own
    # slice what it sends in another's.
    counts = Counter(
        (r.client_region, min(int(r.arrival_s / period * regions), regions - 1))
        for r in workload.requests
    )
    for region in range(regions):
        own = counts[(region, region)]
        others = [counts[(region, s)] for s in range(regions) if s != region]
        assert own / statistics.fmean(others) == pytest.approx(1.05 / 0.5, rel=0.1)
    # At the top of its peak (the middle tenth of its slice) a region sends 1.6 / 0.5
    # what one of its neighbours sends then.
    middle = [
        r for r in workload.requests if abs((r.arrival_s / period * regions) % 1 - 0.5) < 0.05
    ]
    by_region = Counter(r.client_region for r in middle)
    peaking = Counter(min(int(r.arrival_s / period * regions), 3) for r in middle)
    for region in range(regions):
        top = sum(
            1
            for r in middle
            if r.client_region == region == min(int(r.arrival_s / period * regions), 3)
        )
        neighbours = (by_region[region] - top) / 3
        assert top / neighbours == pytest.approx(1.6 / 0.5, rel=0.25), (region, peaking)


def test_multi_region_refuses_a_trough_above_the_peak() -> None:
    with pytest.raises(ConfigError, match="trough"):
        generate("W6", seed=0, rate_rps=1.0, num_requests=10, peak=1.0, trough=2.0)


def test_multi_region_users_share_their_region_prompts() -> None:
    workload = generate("W6", seed=1, rate_rps=10, num_requests=2000, regions=3, **SMALL["W6"])
    systems: dict[int | None, set[tuple[int, ...]]] = defaultdict(set)
    for r in workload.requests:
        assert r.prefix_group is not None
        assert r.prefix_group // 16 == r.client_region
        systems[r.prefix_group].add(r.prompt[:32])
    assert len(systems) == 3 * 16
    assert all(len(prompts) == 1 for prompts in systems.values())


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("W9", {}, "workload = 'W9'"),
        ("W7", {}, "W7.trace = ''"),
        ("W7", {"trace": "/nonexistent/trace.jsonl"}, "cannot read the trace"),
        (
            "W7",
            {"trace": str(MOONCAKE_SAMPLE), "max_prompt_tokens": 10},
            "W7.max_prompt_tokens = 10",
        ),
        ("W1", {"groups": 0}, "W1.groups = 0"),
        ("W1", {"colour": "red"}, "W1.colour = 'red': unknown field"),
        ("W1", {"length_spread": 1.5}, "W1.length_spread = 1.5"),
        ("W1", {"system_tokens": True}, "W1.system_tokens = True"),
        ("W2", {"think_distribution": "weibull"}, "W2.think_distribution = 'weibull'"),
        ("W2", {"think_s": 0.0}, "W2.think_s = 0.0"),
        ("W3", {"min_prompt_tokens": 900, "max_prompt_tokens": 800}, "W3.max_prompt_tokens = 800"),
        ("W4", {"zipf_s": -1.0}, "W4.zipf_s = -1.0"),
        ("W5", {"burstiness": 0}, "W5.burstiness = 0"),
        ("W6", {"regions": 1}, "regions = 1: W6 needs an integer in 2..1000"),
        ("W6", {"peak": 0}, "W6.peak = 0"),
        ("W1", {"rate_rps": 0}, "rate_rps = 0"),
        ("W1", {"rate_rps": math.inf}, "rate_rps = inf"),
        ("W1", {"num_requests": 0}, "num_requests = 0"),
        ("W1", {"seed": 1.5}, "seed = 1.5"),
    ],
)
def test_bad_name_or_parameter_is_a_config_error_naming_it(
    name: str, kwargs: dict[str, Any], expected: str
) -> None:
    arguments: dict[str, Any] = {"seed": 0, "rate_rps": 1.0, "num_requests": 100, **kwargs}
    with pytest.raises(ConfigError) as caught:
        generate(name, **arguments)
    assert expected in str(caught.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        generate("W1", seed=0, rate_rps=-1, num_requests=10, groups=0, system_tokens=0)
    paths = {problem.path for problem in caught.value.problems}
    assert paths == {"rate_rps", "W1.groups", "W1.system_tokens"}


# --- W7: the Mooncake trace -------------------------------------------------------------


def test_mooncake_blocks_become_shared_token_runs_and_arrivals_keep_their_shape() -> None:
    rows = [json.loads(line) for line in MOONCAKE_SAMPLE.read_text().splitlines()]
    workload = generate("W7", seed=0, rate_rps=50.0, num_requests=300, **SMALL["W7"])
    assert len(workload.requests) == 300
    assert workload.params["derived"]["window_start"] == 0
    by_arrival = sorted(rows, key=lambda r: r["timestamp"])
    for row, request in zip(by_arrival, workload.requests, strict=True):
        assert len(request.prompt) == row["input_length"]
        assert request.max_tokens == row["output_length"]
    # Equal block ids are equal token runs: every prompt starts with block 0's 512 tokens.
    firsts = {r.prompt[:512] for r in workload.requests}
    assert len(firsts) == 1
    # A later turn of a conversation extends its earlier prompt, block for block.
    index = {tuple(r["hash_ids"]): i for i, r in enumerate(by_arrival)}
    extended = 0
    for i, row in enumerate(by_arrival):
        shorter = tuple(row["hash_ids"][:-1])
        j = index.get(shorter)
        if j is not None and len(shorter) > 1:
            full = (len(shorter) - 1) * 512  # the earlier turn's last block may be partial
            assert workload.requests[i].prompt[:full] == workload.requests[j].prompt[:full]
            assert workload.requests[i].client_region == workload.requests[j].client_region
            extended += 1
    assert extended > 20
    # Arrivals: the trace's gaps scaled by one factor, mean rate 50 req/s.
    stamps = [r["timestamp"] / 1000.0 for r in by_arrival]
    scale = workload.params["derived"]["time_scale"]
    for stamp, request in zip(stamps, workload.requests, strict=True):
        assert request.arrival_s == pytest.approx((stamp - stamps[0]) * scale, abs=1e-9)
    assert 300 / workload.requests[-1].arrival_s == pytest.approx(50.0)


def test_mooncake_seeds_replay_other_windows_and_cut_long_prompts() -> None:
    one = generate("W7", seed=1, rate_rps=5.0, num_requests=100, **SMALL["W7"])
    assert one.params["derived"]["window_start"] == 1499 % 201
    cut = generate(
        "W7", seed=0, rate_rps=5.0, num_requests=300, max_prompt_tokens=1024,
        max_output_tokens=16, **SMALL["W7"],
    )  # fmt: skip
    assert max(len(r.prompt) for r in cut.requests) == 1024
    assert max(r.max_tokens for r in cut.requests) == 16
    assert cut.params["derived"]["prompts_cut"] > 0


def test_mooncake_needs_enough_rows() -> None:
    with pytest.raises(ConfigError, match="holds 300 requests, fewer than num_requests = 301"):
        generate("W7", seed=0, rate_rps=5.0, num_requests=301, **SMALL["W7"])


@pytest.mark.skipif(
    not (MOONCAKE_REAL / "conversation_trace.jsonl").exists(),
    reason="the Mooncake conversation trace is not beside the repository (CI has it)",
)
def test_a_slice_of_the_real_conversation_trace_shares_its_system_block() -> None:
    trace = str(MOONCAKE_REAL / "conversation_trace.jsonl")
    workload = generate("W7", seed=0, rate_rps=10.0, num_requests=200, regions=4, trace=trace)
    assert {r.prompt[:512] for r in workload.requests}.__len__() == 1
    assert workload.params["derived"]["trace_rows"] == 12_031
    assert {r.client_region for r in workload.requests} == {0, 1, 2, 3}


def test_multi_region_day_is_wall_clock_with_an_outage_and_a_brownout_at_peaks() -> None:
    # 24 hours in 1,200 s: a day's worth of requests at 20 req/s lasts about 1,200 s at
    # any rate, and each fleet event is centred on its region's peak.
    regions, rate = 4, 20.0
    workload = generate("W6", seed=3, rate_rps=rate, num_requests=round(rate * 1200), **SMALL["W6"])
    assert workload.params["derived"]["period_s"] == 1200.0
    assert workload.requests[-1].arrival_s == pytest.approx(1200.0, rel=0.05)
    outage, brownout = workload.events
    assert (outage.kind, outage.region, outage.slowdown) == ("outage", 0, 1.0)
    # Region 0's slice is the first quarter of the day; one hour is 50 s.
    assert (outage.start_s, outage.end_s) == pytest.approx((150.0 - 25.0, 150.0 + 25.0))
    assert (brownout.kind, brownout.region, brownout.slowdown) == ("brownout", 1, 3.0)
    assert (brownout.start_s, brownout.end_s) == pytest.approx((450.0 - 50.0, 450.0 + 50.0))
    # Twice the rate: twice the requests in the same day, events at the same times.
    fast = generate("W6", seed=3, rate_rps=2 * rate, num_requests=round(2 * rate * 1200))
    assert fast.requests[-1].arrival_s == pytest.approx(1200.0, rel=0.05)
    assert fast.events == workload.events
    off = generate(
        "W6", seed=3, rate_rps=rate, num_requests=10, outage_region=None, brownout_region=None
    )
    assert off.events == ()
    assert regions == workload.regions


def test_multi_region_names_a_fleet_event_in_a_region_that_does_not_exist() -> None:
    with pytest.raises(ConfigError, match=r"W6\.brownout_region") as caught:
        generate("W6", seed=0, rate_rps=1.0, num_requests=10, regions=2, brownout_region=2)
    assert "there are 2 regions" in str(caught.value)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    mean=st.integers(1, 5000),
    spread=st.floats(0, 0.99),
    tokens=st.integers(1, 300),
)
def test_the_fast_draws_are_the_standard_librarys_exactly(
    seed: int, mean: int, spread: float, tokens: int
) -> None:
    """The samplers' own draws give the numbers, and leave the stream where, CPython's
    ``randint`` and ``randbytes`` would: every stored trace stays what it was."""
    fast, reference = random.Random(seed), random.Random(seed)
    low = max(1, round(mean * (1 - spread)))
    high = max(low, round(mean * (1 + spread)))
    for _ in range(5):
        assert jittered_length(fast, mean, spread) == reference.randint(low, high)
    skip_tokens(fast, tokens)
    reference.randbytes(4 * tokens)
    assert fast.getstate() == reference.getstate()
