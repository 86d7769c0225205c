"""Where and how many: a model's replica count or autoscaling, and the Ray resources and
placement group of each replica; and where the gateway's replicas run.

Called by :func:`firstlight.serve.app.region_app` once per model and once for the
gateway. A replica whose model is split across GPUs (``vllm.tensor_parallel_size *
pipeline_parallel_size`` > 1) gets a placement group: a first bundle for the replica
itself (its CPUs, no GPU) and one GPU bundle per shard, packed on one node for tensor
parallelism (shards exchange activations every layer); vLLM's Ray executor then starts
its workers in those bundles, as Ray Serve LLM places its engines.

In ``kubernetes`` mode every gateway replica asks for a sliver of
:data:`GATEWAY_RESOURCE`, a custom Ray resource only the Helm chart's head pod
advertises, so the gateways run on the head, whose CPU request the chart computes from
``gateway.replicas`` (docs/deploy.md, "Sizing the head"). Reserving nothing, they would
be spread by Ray over every node, GPU workers included, taking the engines' host cores
unaccounted. The price: a head restart takes the region's gateways with it. Local mode
asks for nothing: its one Ray node runs everything. Pure: no Ray import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from firstlight.config import ModelConfig, PlatformConfig
from firstlight.errors import ConfigError, ConfigProblem

__all__ = [
    "GATEWAY_RESOURCE",
    "GATEWAY_RESOURCE_PER_REPLICA",
    "ReplicaPlacement",
    "check_gateway_placement",
    "gateway_actor_options",
    "replica_placement",
]

GATEWAY_RESOURCE = "firstlight_gateway"
"""The custom Ray resource that marks the node gateways run on: the chart's head advertises
one unit of it (``rayStartParams.resources``), nothing else does, so the autoscaler never
starts a worker for a gateway."""
GATEWAY_RESOURCE_PER_REPLICA = 0.005
"""What one gateway replica asks of :data:`GATEWAY_RESOURCE`: a marker, not an accounting
(the head's CPU request does that), small enough that twice ``gateway.replicas``' bound
fits in the one unit — every gateway and a replacement for each, as when a rolling
update's new replicas start while the old ones drain."""


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """Deployment options for one model's replicas."""

    ray_actor_options: dict[str, Any]
    num_replicas: int | None = None
    """The fixed count; ``None`` when ``autoscaling_config`` decides."""
    autoscaling_config: dict[str, float] | None = None
    placement_group_bundles: list[dict[str, float]] | None = None
    placement_group_strategy: str | None = None
    shards: int = 1

    def deployment_options(self) -> dict[str, Any]:
        """As keyword arguments of ``Deployment.options``."""
        options: dict[str, Any] = {"ray_actor_options": self.ray_actor_options}
        if self.autoscaling_config is not None:
            options["autoscaling_config"] = self.autoscaling_config
        else:
            options["num_replicas"] = self.num_replicas
        if self.placement_group_bundles is not None:
            options["placement_group_bundles"] = self.placement_group_bundles
            options["placement_group_strategy"] = self.placement_group_strategy
        return options


def replica_placement(model: ModelConfig) -> ReplicaPlacement:
    """The resources of ``model``'s replicas (see the module docstring)."""
    resources = model.resources
    actor: dict[str, Any] = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus}
    if resources.memory_gib is not None:
        actor["memory"] = int(resources.memory_gib * 1024**3)
    replicas: dict[str, Any] = {"num_replicas": model.replicas}
    if model.autoscaling is not None:
        scaling = model.autoscaling
        replicas = {
            "autoscaling_config": {
                "min_replicas": scaling.min_replicas,
                "max_replicas": scaling.max_replicas,
                "initial_replicas": model.replicas,
                "target_ongoing_requests": scaling.target_ongoing_requests,
                "upscale_delay_s": scaling.upscale_delay_s,
                "downscale_delay_s": scaling.downscale_delay_s,
            }
        }
    settings = model.vllm
    shards = settings.tensor_parallel_size * settings.pipeline_parallel_size
    if model.engine != "vllm" or shards == 1:
        return ReplicaPlacement(actor, **replicas)
    own: dict[str, float] = {"CPU": resources.num_cpus}
    if "memory" in actor:
        own["memory"] = actor["memory"]
    bundles = [own] + [{"GPU": 1.0} for _ in range(shards)]
    strategy = "STRICT_PACK" if settings.pipeline_parallel_size == 1 else "PACK"
    return ReplicaPlacement(
        {**actor, "num_gpus": 0},
        placement_group_bundles=bundles,
        placement_group_strategy=strategy,
        shards=shards,
        **replicas,
    )


def gateway_actor_options(config: PlatformConfig) -> dict[str, Any]:
    """``ray_actor_options`` of the gateway deployment (see the module docstring): no CPU
    reserved (its cores are the head pod's CPU request, not Ray's bookkeeping), and in
    ``kubernetes`` mode a sliver of :data:`GATEWAY_RESOURCE`, which pins it to the head."""
    options: dict[str, Any] = {"num_cpus": 0}
    if config.mode == "kubernetes":
        options["resources"] = {GATEWAY_RESOURCE: GATEWAY_RESOURCE_PER_REPLICA}
    return options


def check_gateway_placement(config: PlatformConfig, cluster_resources: Mapping[str, float]) -> None:
    """Raise ``ConfigError`` when ``config``'s gateways could never be placed on a Ray
    cluster of ``cluster_resources`` (``ray.cluster_resources()``): ``kubernetes`` mode
    on a cluster no node of which advertises :data:`GATEWAY_RESOURCE`, where Serve would
    wait for them forever. Called by ``firstlight serve`` before it deploys."""
    wanted = gateway_actor_options(config).get("resources", {})
    missing = [name for name in wanted if cluster_resources.get(name, 0) <= 0]
    if missing:
        start = "ray start --resources='" + json.dumps({missing[0]: 1}) + "'"
        raise ConfigError(
            [
                ConfigProblem(
                    "mode",
                    f"gateways run only on a node advertising the Ray resource "
                    f"{missing[0]} (the Helm chart's head does) and no node of this "
                    f"cluster does: start one with `{start}`",
                    config.mode,
                    True,
                )
            ]
        )
