"""Render the configuration reference (every field, type, bounds, default, docstring).

Called by ``firstlight config reference``; ``docs/configuration.md`` embeds its output and
a test keeps the two identical, so the documentation cannot drift from the code. It
reads :class:`~firstlight.config.PlatformConfig`'s JSON schema, which is also what the
Helm chart's values schema is built from.
"""

from __future__ import annotations

import json
from typing import Any

from firstlight.config import PlatformConfig

__all__ = ["config_reference_markdown"]

_BOUNDS = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("multipleOf", "multiple of {}"),
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "≥ {} items"),
    ("pattern", "matches `{}`"),
)


def config_reference_markdown() -> str:
    """Return the reference as a Markdown table, one row per field, depth first."""
    schema = PlatformConfig.model_json_schema()
    rows: list[str] = []
    _walk(schema, "", schema.get("$defs", {}), rows)
    header = "| field | type and bounds | default | description |\n|---|---|---|---|\n"
    return header + "\n".join(rows) + "\n"


def _walk(node: dict[str, Any], prefix: str, defs: dict[str, Any], rows: list[str]) -> None:
    for name, prop in node.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        target, nullable = _resolve(prop, defs)
        items = _resolve(target["items"], defs)[0] if target.get("type") == "array" else None
        rows.append(_row(path, prop, target, items, nullable))
        if "properties" in target:
            _walk(target, path, defs, rows)
        elif items is not None and "properties" in items:
            _walk(items, f"{path}[]", defs, rows)


def _row(
    path: str,
    prop: dict[str, Any],
    target: dict[str, Any],
    items: dict[str, Any] | None,
    nullable: bool,
) -> str:
    kind = f"list of {_type_name(items)}" if items is not None else _type_name(target)
    if nullable:
        kind += " or null"
    bounds = [fmt.format(target[key]) for key, fmt in _BOUNDS if key in target]
    if bounds:
        kind += " (" + ", ".join(bounds) + ")"
    default = prop.get("default")
    shown = "" if "default" not in prop or isinstance(default, dict | list) else default
    default_cell = f"`{json.dumps(shown)}`" if shown != "" else "—"
    description = " ".join(str(prop.get("description", target.get("description", ""))).split())
    cells = (f"`{path}`", kind, default_cell, description)
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Follow ``$ref`` and unwrap ``anyOf [X, null]``; return (schema, nullable)."""
    nullable = False
    if "anyOf" in prop:
        options = [o for o in prop["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(prop["anyOf"])
        if len(options) == 1:
            prop = options[0]
    if "$ref" in prop:
        prop = defs[prop["$ref"].rsplit("/", 1)[-1]]
    return prop, nullable


def _type_name(schema: dict[str, Any] | None) -> str:
    if schema is None:
        return "any"
    if "enum" in schema:
        return " | ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "properties" in schema:
        return "section"
    if schema.get("type") == "object":
        return "mapping"
    if "anyOf" in schema:
        return " or ".join(_type_name(o) for o in schema["anyOf"])
    kind = str(schema.get("type", "any"))
    return f"{kind} ({schema['format']})" if "format" in schema else kind
