"""Mixed fleets: parsing, per-replica profiles, the floor on the fastest, W8."""

from __future__ import annotations

import pytest

from firstlight.engine.sim import PROFILES
from firstlight.errors import ConfigError
from firstlight_bench.simulator.cluster import ClusterSpec, block_hashes, parse_fleet
from firstlight_bench.simulator.des import simulate
from firstlight_bench.simulator.floor import floor_ttfts_ms
from firstlight_bench.simulator.sim import region_profiles
from firstlight_bench.workloads import WORKLOADS, generate

H100, A100, L4 = (PROFILES[n] for n in ("h100-llama-8b", "a100-llama-8b", "l4-llama-8b"))


def test_a_fleet_text_lists_each_regions_replicas() -> None:
    assert parse_fleet("h100-llama-8b*2+l4-llama-8b;a100-llama-8b*3") == (
        ("h100-llama-8b", "h100-llama-8b", "l4-llama-8b"),
        ("a100-llama-8b",) * 3,
    )


@pytest.mark.parametrize("text", ["", "h100-llama-8b*0", "h100-llama-8b*x", "tpu*2", "a;;b"])
def test_a_bad_fleet_is_a_config_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_fleet(text)
    assert caught.value.problems[0].path in {"fleet", "profile"}


def test_the_cluster_checks_the_fleet_against_its_regions() -> None:
    with pytest.raises(ConfigError, match="fleet"):
        ClusterSpec(3, 1, fleet=parse_fleet("h100-llama-8b;l4-llama-8b")).check("random", 1)


def test_each_replica_runs_its_own_profile_with_the_kv_cap_its_device_allows() -> None:
    cluster = ClusterSpec(
        2, 1, kv_cache_blocks=5_000, fleet=parse_fleet("h100-llama-8b+l4-llama-8b;a100-llama-8b")
    )
    assert cluster.total_replicas == 3
    first = cluster.region_profiles(0)
    assert [p.name for p in first] == ["h100-llama-8b", "l4-llama-8b"]
    # 5,000 blocks asked; the L4 holds only its 2,000.
    assert [p.kv_cache_blocks for p in first] == [5_000, 2_000]
    assert first[1].max_model_len == 2_000 * 16


def test_the_floor_takes_each_requests_fastest_replica_and_slow_replicas_are_slow() -> None:
    workload = generate("W8", seed=0, rate_rps=2.0, num_requests=40, regions=4, groups=2)
    fleet = parse_fleet("l4-llama-8b;l4-llama-8b+h100-llama-8b;l4-llama-8b;l4-llama-8b")
    cluster = ClusterSpec(4, 1, kv_cache_blocks=2_000, fleet=fleet)
    hashes = block_hashes(workload, cluster)
    floors = floor_ttfts_ms(workload, hashes, region_profiles(cluster))
    for request in workload.requests:
        kind = H100 if request.client_region == 1 else L4
        assert floors[request.request_id] <= kind.lone_ttft_ms(len(request.prompt)) + 1e-9
    run = simulate(workload, "least_queue", cluster, hashes=hashes)
    by_region: dict[int, list[float]] = {}
    for outcome in run.outcomes:
        assert outcome.ttft_ms is not None
        by_region.setdefault(outcome.client_region, []).append(outcome.ttft_ms)
    # At 2 req/s nothing queues: a lone L4 region is slower than one with an H100.
    assert min(by_region[0]) > 2 * min(by_region[1])


def test_w8_names_its_mixed_fleet() -> None:
    fleet = parse_fleet(WORKLOADS["W8"].fleet or "")
    assert len(fleet) == 4
    assert {name for region in fleet for name in region} == {
        "h100-llama-8b",
        "a100-llama-8b",
        "l4-llama-8b",
    }
    assert generate("W8", seed=0, rate_rps=1.0, num_requests=5).regions == 4
