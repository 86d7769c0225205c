"""Where replicas run (``firstlight.serve.placement``): one GPU bundle per shard of a
model split across GPUs, the replica itself beside them; plain options otherwise; the
gateways, in ``kubernetes`` mode only, on nodes that advertise their resource."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from firstlight.config import ModelConfig, PlatformConfig, parse_config
from firstlight.errors import ConfigError
from firstlight.serve.placement import (
    GATEWAY_RESOURCE,
    GATEWAY_RESOURCE_PER_REPLICA,
    check_gateway_placement,
    gateway_actor_options,
    replica_placement,
)


def _model(**fields: Any) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", **fields})


def test_a_one_gpu_replica_has_no_placement_group() -> None:
    options = replica_placement(
        _model(resources={"num_cpus": 4, "num_gpus": 1, "memory_gib": 2})
    ).deployment_options()
    assert options == {
        "ray_actor_options": {"num_cpus": 4, "num_gpus": 1, "memory": 2 * 1024**3},
        "num_replicas": 1,
    }


def test_tensor_parallel_replicas_get_one_packed_gpu_bundle_per_shard() -> None:
    model = _model(vllm={"tensor_parallel_size": 4}, resources={"num_cpus": 8, "num_gpus": 4})
    options = replica_placement(model).deployment_options()
    assert options["ray_actor_options"] == {"num_cpus": 8, "num_gpus": 0}
    assert options["placement_group_bundles"] == [{"CPU": 8}] + [{"GPU": 1.0}] * 4
    assert options["placement_group_strategy"] == "STRICT_PACK"


def test_pipeline_stages_may_span_nodes() -> None:
    model = _model(
        vllm={"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
        resources={"num_gpus": 4},
    )
    placement = replica_placement(model)
    assert placement.shards == 4
    assert placement.placement_group_strategy == "PACK"


def test_a_simulated_model_is_never_split() -> None:
    model = _model(engine="sim", vllm={"tensor_parallel_size": 4}, resources={"num_gpus": 0})
    assert replica_placement(model).placement_group_bundles is None


@pytest.mark.parametrize("num_gpus", [0, 1, 2, 8])
def test_gpus_must_match_the_shards_naming_both_fields(num_gpus: float) -> None:
    with pytest.raises(ValidationError, match=r"resources\.num_gpus") as caught:
        _model(vllm={"tensor_parallel_size": 4}, resources={"num_gpus": num_gpus})
    assert "vllm.tensor_parallel_size" in str(caught.value)


def test_autoscaling_replaces_the_fixed_count_and_starts_at_replicas() -> None:
    model = _model(
        replicas=2,
        autoscaling={"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2},
    )
    options = replica_placement(model).deployment_options()
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 3,
        "initial_replicas": 2,
        "target_ongoing_requests": 2.0,
        "upscale_delay_s": 10.0,
        "downscale_delay_s": 120.0,
    }


def test_serve_accepts_the_autoscaling_options() -> None:
    from ray.serve.config import AutoscalingConfig

    model = _model(autoscaling={"min_replicas": 1, "max_replicas": 2})
    config = AutoscalingConfig(
        **replica_placement(model).deployment_options()["autoscaling_config"]
    )
    assert (config.min_replicas, config.max_replicas) == (1, 2)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"replicas": 3, "autoscaling": {"min_replicas": 1, "max_replicas": 2}}, "replicas"),
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "min_replicas"),
        ({"autoscaling": {"min_replicas": 0}}, "min_replicas"),
    ],
)
def test_autoscaling_bounds_are_checked_by_name(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        _model(**fields)


def test_the_replica_port_is_used_unless_autoscaling_or_the_handle_is_asked_for() -> None:
    from firstlight.config import parse_config
    from firstlight.serve.model_server import uses_replica_port

    def config(data_path: str, autoscaling: dict[str, int] | None) -> Any:
        model = {"name": "m", "engine": "sim", "replicas": 1, "autoscaling": autoscaling}
        data = {"mode": "local", "regions": [{"name": "r"}], "models": [model]}
        data["gateway"] = {"data_path": data_path}
        return parse_config(data, "test")

    fixed, scaled = None, {"min_replicas": 1, "max_replicas": 2}
    cases = [("replica-port", fixed, True), ("ray-handle", fixed, False)]
    cases.append(("replica-port", scaled, False))  # Serve's autoscaler counts handle calls
    for data_path, autoscaling, expected in cases:
        platform = config(data_path, autoscaling)
        assert uses_replica_port(platform, platform.models[0]) is expected


def _kubernetes_config() -> PlatformConfig:
    return parse_config(
        {
            "mode": "kubernetes",
            "region": "us-east",
            "regions": [{"name": "us-east"}],
            "auth": {"enabled": True, "api_keys": [{"env": "FIRSTLIGHT_API_KEY"}]},
        },
        "test",
    )


def test_local_gateways_ask_for_nothing_but_kubernetes_ones_for_a_gateway_pods_unit() -> None:
    local = PlatformConfig()
    assert local.mode == "local"
    assert gateway_actor_options(local) == {"num_cpus": 0}
    assert gateway_actor_options(_kubernetes_config()) == {
        "num_cpus": 0,
        "resources": {GATEWAY_RESOURCE: GATEWAY_RESOURCE_PER_REPLICA},
    }


def test_serve_refuses_a_cluster_where_kubernetes_gateways_cannot_land() -> None:
    kubernetes = _kubernetes_config()
    check_gateway_placement(kubernetes, {"CPU": 8.0, GATEWAY_RESOURCE: 1.0})
    check_gateway_placement(PlatformConfig(), {"CPU": 8.0})  # local mode asks for nothing
    with pytest.raises(ConfigError) as info:
        check_gateway_placement(kubernetes, {"CPU": 8.0, "GPU": 1.0})
    (problem,) = info.value.problems
    assert problem.path == "mode"
    assert problem.value == "kubernetes"
    assert GATEWAY_RESOURCE in problem.message
    assert kubernetes.gateway.replicas == 2
    assert "ray start --resources='{\"firstlight_gateway\": 2}'" in problem.message
