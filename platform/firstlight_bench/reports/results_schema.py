"""The JSON Schema of a benchmark run's ``results.json``, and its validation.

Called by :func:`firstlight_bench.reports.report.write_run` before it writes anything, and by
tests; the point fields are defined in :mod:`firstlight_bench.reports.results`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, ValidationError

__all__ = ["RESULTS_SCHEMA", "validate_results"]


_NUMBER_OR_NULL: dict[str, Any] = {"type": ["number", "null"]}
_FRACTION_OR_NULL: dict[str, Any] = {"type": ["number", "null"], "minimum": 0, "maximum": 1}


def _percentile_block(*names: str, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """Percentiles ``names`` (required) and ``optional`` ones (absent from runs stored
    before they were added)."""
    return {
        "type": "object",
        "required": list(names),
        "properties": {name: _NUMBER_OR_NULL for name in (*names, *optional)},
        "additionalProperties": False,
    }


_POINT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "arm",
        "load",
        "ttft_ms",
        "tpot_ms",
        "e2e_ms",
        "prefix_hit_rate",
        "goodput",
        "completed",
        "errors",
        "cross_region_share",
        "imbalance",
        "decision_us",
    ],
    "properties": {
        "arm": {"type": "string", "minLength": 1},
        "load": {"type": "number"},
        "ttft_ms": _percentile_block("p50", "p90", "p99"),
        "tpot_ms": _percentile_block("p50", "p99", optional=("p90",)),
        "e2e_ms": _percentile_block("p50", "p99"),
        "prefix_hit_rate": _FRACTION_OR_NULL,
        "goodput": _FRACTION_OR_NULL,
        "completed": {"type": "integer", "minimum": 0},
        "errors": {"type": "integer", "minimum": 0},
        "cross_region_share": _FRACTION_OR_NULL,
        "imbalance": {"type": "number", "minimum": 0},
        "decision_us": _percentile_block("p50", "p99"),
        "goodput_by_slo": {"type": "object", "additionalProperties": _FRACTION_OR_NULL},
        "duration_s": {"type": "number", "exclusiveMinimum": 0},
        "throughput_rps": {"type": "number", "minimum": 0},
        "output_tokens_per_s": {"type": "number", "minimum": 0},
        "seed": {"type": "integer"},
        "prediction_ape": _percentile_block("p50", "p90"),
        "floor_ttft_ms": _percentile_block("p50", "p90", "p99"),
        "ttft_vs_floor": _percentile_block("p50", "p90"),
        "warm": {
            "type": "object",
            "required": ["requests", "chosen", "replayed", "differing", "best_share"],
            "properties": {
                "requests": {"type": "integer", "minimum": 0},
                "chosen": {"type": "object", "additionalProperties": {"type": "integer"}},
                "pulled_bytes": {"type": "integer", "minimum": 0},
                "replayed": {"type": "integer", "minimum": 0},
                "differing": {"type": "integer", "minimum": 0},
                "best_share": _FRACTION_OR_NULL,
                "best_way": {"type": "object", "additionalProperties": {"type": "integer"}},
                "price_ape_p50": {"type": "object", "additionalProperties": _NUMBER_OR_NULL},
            },
            "additionalProperties": False,
        },
        "day": {
            "type": "object",
            "required": ["period_s", "hours", "peak", "events"],
            "properties": {
                "period_s": {"type": "number", "exclusiveMinimum": 0},
                "hours": {"type": "array", "items": {"type": "object"}},
                "peak": {"type": "object"},
                "events": {"type": "array", "items": {"type": "object"}},
            },
        },
    },
    "additionalProperties": False,
}

RESULTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://firstlight.dev/schemas/bench-results.json",
    "title": "Firstlight benchmark results",
    "type": "object",
    "required": ["meta", "points"],
    "properties": {
        "meta": {
            "type": "object",
            "required": ["seed", "git_commit", "config", "workload", "simulated", "created_at"],
            "properties": {
                "seed": {"type": "integer"},
                "git_commit": {"type": "string", "minLength": 1},
                "config": {"type": "object"},
                "workload": {"type": "object"},
                "simulated": {"type": "boolean"},
                "created_at": {"type": "string", "format": "date-time"},
                "command": {"type": "string"},
            },
        },
        "points": {"type": "array", "minItems": 1, "items": _POINT_SCHEMA},
    },
    "additionalProperties": False,
}
"""JSON Schema (draft 2020-12) of a whole ``results.json``; ``meta`` may hold more keys."""

_VALIDATOR = Draft202012Validator(RESULTS_SCHEMA)


def _non_finite(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, float) and not math.isfinite(value):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _non_finite(item, f"{path}[{index}]")


def _document_order(error: ValidationError) -> list[tuple[int, str]]:
    # List indexes compare as numbers, keys as text: ``points[2]`` comes before ``points[10]``.
    return [(p, "") if isinstance(p, int) else (-1, p) for p in error.absolute_path]


def validate_results(data: Any) -> None:
    """Check a whole results document against :data:`RESULTS_SCHEMA`.

    Called by :func:`firstlight_bench.reports.report.write_run` before it writes, and by tests.
    Raises ``ValueError`` naming the JSON path of the first problem (``$.points[2].load:
    'x' is not of type 'number'``); also for NaN/infinite numbers (JSON has none) and for
    two points with the same arm, load and seed.
    """
    errors = sorted(_VALIDATOR.iter_errors(data), key=_document_order)
    if errors:
        first = errors[0]
        raise ValueError(f"{first.json_path}: {first.message}")
    for path in _non_finite(data, "$"):
        raise ValueError(f"{path}: not a finite number (JSON has no NaN or infinity)")
    seen: dict[tuple[str, float, int | None], int] = {}
    for index, point in enumerate(data["points"]):
        key = (point["arm"], point["load"], point.get("seed"))
        if key in seen:
            on_seed = "" if key[2] is None else f" on seed {key[2]}"
            raise ValueError(
                f"$.points[{index}]: arm {key[0]!r} at load {key[1]!r}{on_seed} repeats "
                f"$.points[{seen[key]}]"
            )
        seen[key] = index
