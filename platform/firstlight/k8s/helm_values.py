"""A ``PlatformConfig`` as the Helm chart's values (``firstlight config to-helm-values``).

Who calls it: the CLI. The chart turns the values back into a config
(``templates/_helpers.tpl``, ``firstlight.platformConfig``); the chart tests render
:func:`to_helm_values` output and check that the config the RayService receives equals
the original in every field the values carry.

Only what differs from the defaults is written (the chart's defaults are the config's
defaults — a test holds them equal), so a values file stays short and follows future
default changes. Fields the chart owns come back as notes: secrets become Kubernetes
Secrets the operator creates, the Redis URL becomes ``redis``/``externalRedis``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from firstlight.config import HintsConfig, PlatformConfig
from firstlight.errors import ConfigError, ConfigProblem

__all__ = ["API_KEYS_SECRET", "EXTERNAL_REDIS_SECRET", "HelmValues", "to_helm_values"]

API_KEYS_SECRET = "firstlight-api-keys"
"""Default name of the Secret holding the API keys (``auth.apiKeys.existingSecret``)."""
PEER_SECRET = "firstlight-peer"
"""Default name of the Secret holding the regions' hop key (``auth.peerSecret``)."""
EXTERNAL_REDIS_SECRET = "firstlight-redis-external"
"""Name suggested for the Secret with an external Redis's password."""


@dataclass(frozen=True)
class HelmValues:
    """Values for one region, plus what the operator must do besides (create Secrets)."""

    values: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def to_helm_values(config: PlatformConfig, region: str | None = None) -> HelmValues:
    """Values that make the chart deploy ``region`` (default: ``config.region``) of
    ``config``.

    Raises :class:`ConfigError` when no region is named, the region is unknown, or one of
    its peers has no URL (a peer in another cluster is reached over HTTPS).
    """
    name = region or config.region
    names = [r.name for r in config.regions]
    if name is None:
        raise ConfigError([ConfigProblem("region", "pass --region or set region")])
    if name not in names:
        known = ", ".join(names)
        raise ConfigError([ConfigProblem("region", f"unknown region; known: {known}", name, True)])
    index = names.index(name)
    peers = []
    for j, peer in enumerate(config.regions[index].peers):
        if peer.url is None:
            path = f"regions[{index}].peers[{j}].url"
            raise ConfigError([ConfigProblem(path, "a peer needs a URL outside local mode", None)])
        peers.append({"region": peer.region, "url": str(peer.url), "rtt_ms": peer.rtt_ms})
    notes: list[str] = []
    values: dict[str, Any] = {
        "region": {"name": name, "peers": peers},
        "models": [m.model_dump(mode="json", exclude_defaults=True) for m in config.models],
    }
    for section in ("router", "telemetry"):
        changed = getattr(config, section).model_dump(mode="json", exclude_defaults=True)
        if changed:
            values[section] = changed
    values.update(_hints(config.hints, notes))
    values["auth"] = _auth(config, notes, bool(peers))
    gateway = config.gateway.model_dump(
        mode="json", exclude_defaults=True, exclude={"host", "port"}
    )
    if gateway:
        values["gateway"] = gateway
    return HelmValues(values, notes)


def _hints(hints: HintsConfig, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    changed = hints.model_dump(
        mode="json", exclude_defaults=True, exclude={"redis_url", "password", "tls_ca_file"}
    )
    if changed:
        out["hints"] = changed
    if hints.tls_ca_file is not None:
        notes.append(
            "hints.tls_ca_file: the chart mounts a CA only for its own Redis (redis.tls); "
            "an external Redis must have a certificate the image's trust store accepts"
        )
    if hints.redis_url == HintsConfig().redis_url:  # the chart runs its own Redis
        notes.append(
            "redis: create Secret firstlight-redis with the in-chart Redis's password: "
            "kubectl create secret generic firstlight-redis "
            '--from-literal=password="$(openssl rand -hex 32)"'
        )
        return out
    external: dict[str, Any] = {"url": hints.redis_url}
    if hints.password is not None:
        external["existingSecret"] = EXTERNAL_REDIS_SECRET
        notes.append(
            f"hints.password: put the Redis password in Secret {EXTERNAL_REDIS_SECRET} "
            f"(key 'password'): kubectl create secret generic {EXTERNAL_REDIS_SECRET} "
            "--from-literal=password=..."
        )
    out["redis"] = {"enabled": False}
    out["externalRedis"] = external
    return out


def _auth(config: PlatformConfig, notes: list[str], has_peers: bool) -> dict[str, Any]:
    count = max(1, len(config.auth.api_keys))
    keys = [f"api-key-{i}" for i in range(count)]
    if not config.auth.enabled:
        notes.append("auth.enabled: the chart always requires API keys (kubernetes mode)")
    literals = " ".join(f'--from-literal={key}="$(openssl rand -hex 32)"' for key in keys)
    notes.append(
        f"auth.api_keys: create Secret {API_KEYS_SECRET} with the keys {', '.join(keys)} "
        f": kubectl create secret generic "
        f"{API_KEYS_SECRET} {literals}"
    )
    api_keys: dict[str, Any] = {"existingSecret": API_KEYS_SECRET, "keys": keys}
    pairs = zip(keys, config.auth.api_keys, strict=False)  # keys has one even without refs
    tenants: dict[str, str] = {}
    contexts: dict[str, Any] = {}
    for name, ref in pairs:
        if ref.tenant:
            tenants[name] = ref.tenant
        if ref.dynamic_context is not None:
            contexts[name] = ref.dynamic_context.model_dump(mode="json", exclude_defaults=True)
    if tenants:
        api_keys["tenants"] = tenants
    if contexts:
        api_keys["dynamicContext"] = contexts
    auth: dict[str, Any] = {"enabled": True, "apiKeys": api_keys}
    notes.append(
        "auth.operator_keys: create Secret firstlight-operator with the key operator-key "
        "(it opens /metrics and the dashboard's state; the ServiceMonitor scrapes with it): "
        "kubectl create secret generic firstlight-operator "
        '--from-literal=operator-key="$(openssl rand -hex 32)"'
    )
    if has_peers:  # the chart requires the regions' hop key then
        auth["peerSecret"] = {"existingSecret": PEER_SECRET, "key": "peer-secret"}
        notes.append(
            f"auth.peer_secret: create Secret {PEER_SECRET} with the key peer-secret, the "
            f"same value in every region: kubectl create secret generic {PEER_SECRET} "
            '--from-literal=peer-secret="$(openssl rand -hex 32)"'
        )
    if config.auth.tenant_isolation is not None:
        auth["tenant_isolation"] = config.auth.tenant_isolation
    return auth
