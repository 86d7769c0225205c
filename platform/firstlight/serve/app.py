"""Application builders: one region's Ray Serve application from a ``PlatformConfig``.

* :func:`region_app` — called by ``firstlight up`` (every region of a local config) and by
  :func:`build_app`.
* :func:`build_app` — the import path ``firstlight.serve.app:build_app`` that
  ``serve run`` and KubeRay's ``serveConfigV2`` reference, with ``args``
  ``{"config": "<path to YAML>", "region": "<name>"}`` (environment overrides apply).

A region's application is a ``gateway`` ingress deployment bound to one ``model-<name>``
deployment per model, each routed by the
:class:`~firstlight.serve.request_router.FirstlightRequestRouter` with the configured
policy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from firstlight.config import ModelConfig, PlatformConfig, load_config, load_config_data
from firstlight.errors import ConfigError, ConfigProblem
from firstlight.routing import build_policy
from firstlight.serve.gateway_deployment import Gateway
from firstlight.serve.keys import launcher_key
from firstlight.serve.model_server import (
    MAX_ONGOING_REQUESTS,
    ModelServer,
    hint_key_prefix,
    uses_replica_port,
)
from firstlight.serve.placement import gateway_actor_options, replica_placement
from firstlight.serve.request_router import FirstlightRequestRouter, router_kwargs

__all__ = [
    "ROUTING_STATS_PERIOD_S",
    "build_app",
    "deployment_name",
    "region_app",
    "serve_logging_options",
]

ROUTING_STATS_PERIOD_S = 0.5
"""How often each replica reports its load to the routers (through Ray's controller)."""


def deployment_name(model: ModelConfig) -> str:
    """The Ray Serve deployment name of ``model`` (``model-<slug>``)."""
    return "model-" + re.sub(r"[^A-Za-z0-9_-]", "-", model.name)


def region_app(config: PlatformConfig, region: str, *, hints_enabled: bool = True) -> Application:
    """The application serving ``region``. Raises ``ConfigError`` for an unknown region
    or bad ``router.params`` (checked here, before anything is deployed). Without
    ``auth.peer_secret`` its deployments get this process's launcher key
    (:mod:`firstlight.serve.keys`): the regions one launcher builds share it."""
    names = [r.name for r in config.regions]
    if region not in names:
        raise ConfigError(
            [ConfigProblem("region", f"unknown region; known: {', '.join(names)}", region, True)]
        )
    build_policy(config.router.policy, config.router.params)
    _check_sim_profiles(config)
    config_json = config.model_dump(mode="json")
    launcher = launcher_key(config)
    handles = {}
    for model in config.models:
        kwargs = router_kwargs(
            region=region,
            model=model.name,
            policy=config.router.policy,
            params=dict(config.router.params),
            hints=config.hints if hints_enabled else None,
            hint_key_prefix=hint_key_prefix(config, region),
            share_routes=config.gateway.share_routes and config.gateway.replicas > 1,
            replica_port=uses_replica_port(config, model),
        )
        deployment = _deployment(ModelServer).options(
            name=deployment_name(model),
            max_ongoing_requests=MAX_ONGOING_REQUESTS,
            graceful_shutdown_timeout_s=30,
            request_router_config=_router_config(kwargs),
            **replica_placement(model).deployment_options(),
            **serve_logging_options(config),
        )
        handles[model.name] = deployment.bind(
            config_json, region, model.name, hints_enabled, launcher
        )
    gateway = _deployment(serve.ingress()(Gateway)).options(
        name="gateway",
        num_replicas=config.gateway.replicas,
        max_ongoing_requests=1024,
        ray_actor_options=gateway_actor_options(config),
        **serve_logging_options(config),
    )
    application: Application = gateway.bind(config_json, region, handles, launcher)
    return application


def serve_logging_options(config: PlatformConfig) -> dict[str, Any]:
    """Deployment options for Serve's own log format: ``telemetry.log_format: json``
    asks Serve to write each replica's records as JSON, and Serve's JSON lines carry
    every attribute a record has beyond the standard ones, so the request's ids
    (:mod:`firstlight.telemetry.logs`) become fields of their own; ``text`` keeps
    Serve's default."""
    if config.telemetry.log_format != "json":
        return {}
    return {"logging_config": {"encoding": "JSON"}}


def _router_config(kwargs: dict[str, Any]) -> RequestRouterConfig:
    # Ray's pydantic model confuses mypy's plugin-less view of its fields.
    fields: dict[str, Any] = {
        "request_router_class": FirstlightRequestRouter,
        "request_router_kwargs": kwargs,
        "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
        "request_routing_stats_timeout_s": 5,
    }
    return RequestRouterConfig(**fields)


def _deployment(cls: type) -> Any:
    # ray.serve.deployment's overloads do not type-check a bare class argument.
    return serve.deployment(cls)


def _check_sim_profiles(config: PlatformConfig) -> None:
    from firstlight.engine.sim.profiles import PROFILES

    for i, model in enumerate(config.models):
        if model.engine == "sim" and model.sim_profile not in PROFILES:
            known = ", ".join(PROFILES)
            raise ConfigError(
                [
                    ConfigProblem(
                        f"models[{i}].sim_profile",
                        f"unknown simulator profile; known: {known}",
                        model.sim_profile,
                        True,
                    )
                ]
            )


def build_app(args: dict[str, Any]) -> Application:
    """Ray Serve's application builder: ``args`` = ``{"config": ..., "region": name}``
    where ``config`` is a YAML file's path or the configuration itself as a mapping (what
    the Helm chart's RayService passes). Environment overrides apply to both.

    Raises ``ConfigError`` (Ray reports it as the application's deploy failure).
    """
    source = args.get("config")
    if isinstance(source, Mapping):
        config = load_config_data(source, "serveConfigV2 args.config")
    else:
        config = load_config(source)
    region = args.get("region") or config.region
    if region is None:
        raise ConfigError([ConfigProblem("region", "pass args.region or set region", None)])
    return region_app(config, region)
