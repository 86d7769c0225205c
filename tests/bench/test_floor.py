"""The floor reference: a lone request's TTFT with its region's earlier blocks cached."""

from __future__ import annotations

import pytest

from firstlight.engine.sim import PROFILES
from firstlight.prefix import HashScheme, hint_hashes
from firstlight_bench.simulator.floor import floor_ttfts_ms
from firstlight_bench.workloads import TraceRequest, Workload

H100 = PROFILES["h100-llama-8b"]
SCHEME = HashScheme(H100.block_size, 0)
SYSTEM = tuple(range(1, 1025))  # 64 blocks of 16


def _request(i: int, t: float, prompt: tuple[int, ...], region: int = 0) -> TraceRequest:
    return TraceRequest(f"q{i}", t, region, prompt, 8, None)


def _floors(*requests: TraceRequest) -> dict[str, float]:
    workload = Workload("test", 0, 1.0, {}, requests, 2)
    hashes = {r.request_id: hint_hashes(r.prompt, SCHEME) for r in requests}
    return floor_ttfts_ms(workload, hashes, {0: [H100], 1: [H100]})


def test_a_repeated_prefix_counts_as_cached_once_its_first_prefill_is_done() -> None:
    question = tuple(range(5000, 5064))
    cold_ms = H100.lone_ttft_ms(len(SYSTEM) + 64)
    floors = _floors(
        _request(0, 0.0, SYSTEM + question),
        _request(1, 0.001, SYSTEM + question[::-1]),  # before q0's prefill is done
        _request(2, 1.0, SYSTEM + tuple(range(6000, 6064))),
    )
    assert floors["q0"] == pytest.approx(cold_ms)
    assert floors["q1"] == pytest.approx(cold_ms)
    assert floors["q2"] == pytest.approx(H100.lone_ttft_ms(len(SYSTEM) + 64, len(SYSTEM)))
    assert floors["q2"] < cold_ms / 2


def test_regions_do_not_share_their_caches() -> None:
    floors = _floors(_request(0, 0.0, SYSTEM), _request(1, 5.0, SYSTEM, region=1))
    assert floors["q1"] == pytest.approx(floors["q0"])


def test_only_the_leading_chain_counts() -> None:
    # The same blocks after a different first block are not a prefix hit.
    floors = _floors(_request(0, 0.0, SYSTEM), _request(1, 5.0, (99_999,) * 16 + SYSTEM))
    assert floors["q1"] == pytest.approx(H100.lone_ttft_ms(len(SYSTEM) + 16))
