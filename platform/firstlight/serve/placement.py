"""Where and how many: a model's replica count or autoscaling, and the Ray resources and
placement group of each replica.

Called by :func:`firstlight.serve.app.region_app` once per model. A replica whose model
is split across GPUs (``vllm.tensor_parallel_size * pipeline_parallel_size`` > 1)
gets a placement group: a first bundle for the replica itself (its CPUs, no GPU) and one
GPU bundle per shard, packed on one node for tensor parallelism (shards exchange
activations every layer); vLLM's Ray executor then starts its workers in those bundles,
as Ray Serve LLM places its engines. Pure: no Ray import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from firstlight.config import ModelConfig

__all__ = ["ReplicaPlacement", "replica_placement"]


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
