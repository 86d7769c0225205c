"""The Helm chart's ``values.schema.json``, generated from :class:`PlatformConfig`.

Who calls it: ``make helm-schema`` (``python -m firstlight.k8s.values_schema``) writes
``helm/firstlight/values.schema.json``; a test holds the committed file equal to
:func:`values_schema`, so the chart and the config cannot drift apart.

The values have two kinds of sections:

* **config sections** in ``snake_case`` — ``region``, ``models``, ``router``, ``hints``,
  ``auth``, ``telemetry``, ``gateway`` — are :class:`PlatformConfig`'s own fields with its
  bounds, enums, patterns and descriptions (taken from pydantic's JSON schema). The
  fields the chart decides (``mode``, ``regions``, ``hints.redis_url``,
  ``hints.password``, ``auth.api_keys``, ``gateway.host``/``port``) are left out; a
  region's ``peers`` must have a ``url`` (kubernetes mode) and auth cannot be off.
* **chart sections** in ``camelCase`` (:mod:`firstlight.k8s._chart_schema`) describe
  Kubernetes objects: image, Ray cluster, Redis, ingress, monitoring, policies.

Cross-field rules (a speculative method without its draft model, duplicate model names)
are not expressible here; the application checks them when it deploys, and
``firstlight config validate`` checks them before ``helm install``.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from firstlight.config import PlatformConfig
from firstlight.k8s._chart_schema import CHART_SECTIONS

__all__ = ["CHART_OWNED_FIELDS", "CONFIG_SECTIONS", "values_schema", "write_values_schema"]

CONFIG_SECTIONS = ("region", "models", "router", "hints", "auth", "telemetry", "gateway")
"""Top-level values that are PlatformConfig fields (``region`` is the region's entry in
``regions``: its name and peers)."""

CHART_OWNED_FIELDS = {
    "hints": ("redis_url", "password", "tls_ca_file"),
    "auth": ("api_keys", "operator_keys", "peer_secret"),
    "gateway": ("host", "port"),
}
"""Config fields the chart sets itself (from ``redis``, ``auth.apiKeys``,
``auth.peerSecret``, ``auth.operatorKey``, ``redis.tls`` and the pod layout), so they
are not values."""

_SCHEMA_ID = "https://json-schema.org/draft-07/schema#"


def values_schema() -> dict[str, Any]:
    """The JSON schema of the chart's values (draft 7, what Helm validates with)."""
    source = PlatformConfig.model_json_schema(mode="validation")
    defs = {name: _tidy(schema) for name, schema in source["$defs"].items()}
    for section, owned in CHART_OWNED_FIELDS.items():
        name = _def_name(source, section)
        for field in owned:
            defs[name]["properties"].pop(field)
    _require_peer_urls(defs["PeerConfig"])
    auth = defs["AuthConfig"]
    auth["properties"]["enabled"] = {
        "const": True,
        "default": True,
        "description": "API keys are required outside local mode; cannot be turned off.",
    }
    auth["properties"]["apiKeys"] = CHART_SECTIONS["auth.apiKeys"]
    auth["properties"]["peerSecret"] = CHART_SECTIONS["auth.peerSecret"]
    auth["properties"]["operatorKey"] = CHART_SECTIONS["auth.operatorKey"]
    auth["required"] = ["apiKeys"]
    region = defs["RegionConfig"]
    region["description"] = "This region and the peers it may spill over or fail over to."
    properties: dict[str, Any] = {
        "region": {"$ref": "#/$defs/RegionConfig"},
        "models": {
            "type": "array",
            "minItems": 1,
            "items": {"$ref": "#/$defs/ModelConfig"},
            "description": _tidy(source["properties"]["models"])["description"],
        },
    }
    for section in ("router", "hints", "auth", "telemetry", "gateway"):
        properties[section] = {"$ref": f"#/$defs/{_def_name(source, section)}"}
    properties.update({k: v for k, v in CHART_SECTIONS.items() if "." not in k})
    return {
        "$schema": _SCHEMA_ID,
        "title": "Firstlight chart values",
        "description": (
            "snake_case sections are PlatformConfig fields (generated from the config's "
            "schema by `make helm-schema`); camelCase sections configure Kubernetes objects."
        ),
        "type": "object",
        "additionalProperties": False,
        "required": ["region", "models", "auth"],
        "properties": properties,
        "allOf": _CONDITIONS,
        "$defs": defs,
    }


def _when(section: str, flag: str, value: bool, then: dict[str, Any]) -> dict[str, Any]:
    return {
        "if": {
            "properties": {section: {"properties": {flag: {"const": value}}}},
            "required": [section],
        },
        "then": then,
    }


_CONDITIONS = [
    _when(
        "ingress",
        "enabled",
        True,
        {
            "properties": {
                "ingress": {"required": ["host"], "properties": {"host": {"minLength": 1}}}
            }
        },
    ),
    _when(
        "redis",
        "enabled",
        False,
        {
            "required": ["externalRedis"],
            "properties": {
                "externalRedis": {"required": ["url"], "properties": {"url": {"minLength": 1}}}
            },
        },
    ),
]
"""Cross-section rules: an enabled Ingress needs a host; no in-chart Redis needs a URL."""


def write_values_schema(path: Path) -> None:
    """Write :func:`values_schema` to ``path`` as the committed, diff-friendly JSON."""
    path.write_text(json.dumps(values_schema(), indent=2) + "\n", encoding="utf-8")


def _def_name(source: dict[str, Any], section: str) -> str:
    ref: str = source["properties"][section]["$ref"]
    return ref.rsplit("/", 1)[1]


def _require_peer_urls(peer: dict[str, Any]) -> None:
    url = peer["properties"]["url"]
    url["type"] = "string"
    url["pattern"] = "^https?://[^\\s/]+"
    url.pop("default", None)
    url["description"] = (
        "Base URL of the peer's public gateway (``https://eu-west.llm.example.com``)."
    )
    peer["required"] = ["region", "url", "rtt_ms"]


def _tidy(schema: Any) -> Any:
    """Drop pydantic's titles and fold ``anyOf [X, null]`` into X, so Helm's errors
    name the allowed values instead of "anyOf failed"."""
    if isinstance(schema, list):
        return [_tidy(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _tidy(v) for k, v in schema.items() if k != "title" or not isinstance(v, str)}
    variants = out.get("anyOf")
    if isinstance(variants, list) and len(variants) == 2 and {"type": "null"} in variants:
        (other,) = (v for v in variants if v != {"type": "null"})
        if "$ref" not in other:
            del out["anyOf"]
            merged = copy.deepcopy(other)
            if "enum" in merged:
                merged["enum"] = [*merged["enum"], None]
            kind = merged.get("type")
            if isinstance(kind, str):
                merged["type"] = [kind, "null"]
            out = {**merged, **out}
    return _name_the_value(out)


def _name_the_value(schema: dict[str, Any]) -> dict[str, Any]:
    """Turn a string enum into a type plus an anchored pattern: Helm's enum error lists
    the allowed values but not the rejected one; its pattern error quotes both."""
    members = schema.get("enum")
    if isinstance(members, list):
        words = [m for m in members if m is not None]
        if words and all(isinstance(m, str) for m in words):
            del schema["enum"]
            schema["type"] = ["string", "null"] if None in members else "string"
            schema["pattern"] = "^(" + "|".join(m.replace(".", "\\.") for m in words) + ")$"
    return schema


if __name__ == "__main__":
    write_values_schema(Path(sys.argv[1]))
