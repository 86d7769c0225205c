"""Typed platform configuration: one :class:`PlatformConfig` made of frozen sections.

Who uses it: the CLI (``firstlight config validate``, ``prepare-model``), and later the
Ray Serve app builders, the Helm values mapping and the benchmark. Everything else
receives the section it needs, already validated — no module reads its own environment
variables.

Sources, in increasing precedence:

1. defaults declared here (a one-region local setup serving the default model);
2. a YAML file (:func:`load_config`);
3. environment variables ``FIRSTLIGHT__<SECTION>__<FIELD>=<yaml value>``, with list
   indices as numbers, e.g. ``FIRSTLIGHT__ROUTER__POLICY=least_queue`` or
   ``FIRSTLIGHT__MODELS__0__REPLICAS=2``.

Every problem is reported at once as a :class:`~firstlight.errors.ConfigError` whose
problems name the field path and the offending value.
"""

from firstlight.config._base import FieldValueError
from firstlight.config.auth import ApiKeyRef, AuthConfig, SecretRef
from firstlight.config.gateway import GatewayConfig
from firstlight.config.loading import (
    load_config,
    load_config_data,
    parse_config,
    validation_problems,
)
from firstlight.config.model import (
    DEFAULT_MODEL_NAME,
    RESERVED_ENGINE_ARGS,
    Dtype,
    DynamicContextSettings,
    EngineName,
    LoraAdapter,
    ModelConfig,
    ResourcesConfig,
    SpeculativeConfig,
    VllmSettings,
)
from firstlight.config.quota import TokenQuotaConfig
from firstlight.config.sections import (
    ENV_PREFIX,
    HintsConfig,
    PeerConfig,
    PlatformConfig,
    PolicyName,
    RegionConfig,
    RouterConfig,
    SloConfig,
    TelemetryConfig,
    default_cache_dir,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ENV_PREFIX",
    "RESERVED_ENGINE_ARGS",
    "ApiKeyRef",
    "AuthConfig",
    "Dtype",
    "DynamicContextSettings",
    "EngineName",
    "FieldValueError",
    "GatewayConfig",
    "HintsConfig",
    "LoraAdapter",
    "ModelConfig",
    "PeerConfig",
    "PlatformConfig",
    "PolicyName",
    "RegionConfig",
    "ResourcesConfig",
    "RouterConfig",
    "SecretRef",
    "SloConfig",
    "SpeculativeConfig",
    "TelemetryConfig",
    "TokenQuotaConfig",
    "VllmSettings",
    "default_cache_dir",
    "load_config",
    "load_config_data",
    "parse_config",
    "validation_problems",
]
