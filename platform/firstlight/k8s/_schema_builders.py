"""Builders of the chart's JSON-schema fragments, and the patterns its values share.

Used by :mod:`firstlight.k8s._chart_schema` (the chart's own value sections). Each
builder returns a plain JSON-schema dict; objects of our own keys reject unknown keys.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DNS_LABEL",
    "DNS_NAME",
    "DURATION",
    "ENV",
    "SECRET_KEY",
    "SECRET_NAME",
    "boolean",
    "integer",
    "k8s",
    "obj",
    "placement",
    "pod_monitor",
    "string",
    "string_map",
]

DNS_LABEL = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_NAME = "^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
DURATION = "^[0-9]+(ms|s|m|h)$"
ENV = "^[A-Za-z_][A-Za-z0-9_]*$"


def obj(description: str, required: tuple[str, ...] = (), **properties: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "description": description,
        "properties": properties,
    }
    if required:
        out["required"] = list(required)
    return out


def string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def integer(description: str, minimum: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum, "description": description}


def string_map(description: str) -> dict[str, Any]:
    """Labels, annotations, node selectors: string to string."""
    return {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": description,
    }


def k8s(description: str, kind: str = "object") -> dict[str, Any]:
    """A Kubernetes structure passed through as is (validated by the API server)."""
    return {"type": kind, "description": description}


def pod_monitor(description: str) -> dict[str, Any]:
    return obj(
        description,
        enabled=boolean("Create the PodMonitor where the cluster serves its kind."),
        interval=string("Scrape interval.", pattern=DURATION),
        labels=string_map("Labels your Prometheus selects PodMonitors by."),
    )


def placement(what: str) -> dict[str, Any]:
    return {
        "resources": k8s(f"Container resources of {what} (requests/limits)."),
        "nodeSelector": string_map(f"Node labels {what} must run on."),
        "tolerations": k8s(f"Tolerations of {what}.", "array"),
        "affinity": k8s(f"Affinity of {what}."),
    }


SECRET_NAME = string("Name of an existing Secret.", pattern=f"^$|{DNS_NAME}")
SECRET_KEY = string("Key in that Secret.", pattern="^[-._a-zA-Z0-9]+$")
