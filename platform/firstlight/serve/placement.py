"""Where and how many: a model's replica count or autoscaling, and the Ray resources and
placement group of each replica; and where the gateway's replicas run.

Called by :func:`firstlight.serve.app.region_app` once per model and once for the
gateway. A replica whose model is split across GPUs (``vllm.tensor_parallel_size *
pipeline_parallel_size`` > 1) gets a placement group: a first bundle for the replica
itself (its CPUs, no GPU) and one GPU bundle per shard, packed on one node for tensor
parallelism (shards exchange activations every layer); vLLM's Ray executor then starts
its workers in those bundles, as Ray Serve LLM places its engines.

In ``kubernetes`` mode every gateway replica asks for one unit of
:data:`GATEWAY_RESOURCE`, a custom Ray resource only the Helm chart's gateway pods
advertise (``rayCluster.gateways``: a CPU-only worker group, each pod ``gatewaysPerPod``
units and a CPU request sized for that many gateways; docs/deploy.md, "Sizing the head and
the gateway pods"). So the gateways run there and nowhere else: not on the head, whose
restart would then take the region's endpoint with it, and not on GPU workers, where
they would take the engines' host cores unaccounted; a pod never hosts more gateways
than it is sized for, and Ray's autoscaler never starts a GPU worker for one. Ray Serve
places a deployment's replicas with Ray's ``SPREAD`` strategy, so they go to different
pods where the units allow. Local mode asks for nothing: its one Ray node runs
everything. Pure: no Ray import.
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
"""The custom Ray resource that marks the nodes gateways run on: the chart's gateway pods
advertise it (``rayStartParams.resources``), one unit per gateway a pod is sized for;
nothing else does, so the autoscaler never starts a GPU worker for a gateway."""
GATEWAY_RESOURCE_PER_REPLICA = 1.0
"""What one gateway replica asks of :data:`GATEWAY_RESOURCE`: one unit, so a pod that
advertises ``n`` units hosts at most ``n`` gateways, the count its CPU request is sized
for. A rolling update's new gateway waits for an old one on a full pod to finish
draining (Serve stops old replicas before it starts their successors)."""


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
    reserved (its cores are the gateway pod's CPU request, not Ray's bookkeeping), and in
    ``kubernetes`` mode one unit of :data:`GATEWAY_RESOURCE`, which places it on a gateway
    pod with room for it."""
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
        units = {missing[0]: config.gateway.replicas}
        start = "ray start --resources='" + json.dumps(units) + "'"
        raise ConfigError(
            [
                ConfigProblem(
                    "mode",
                    f"gateways run only on nodes advertising the Ray resource "
                    f"{missing[0]}, one unit per gateway (the Helm chart's gateway pods "
                    f"do), and no node of this cluster does: start one with room for "
                    f"the {config.gateway.replicas} gateway(s) with `{start}`",
                    config.mode,
                    True,
                )
            ]
        )
