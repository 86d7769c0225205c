"""Published benchmark shapes as named parameter sets of our workloads.

``firstlight bench sim --preset NAME`` (and the suite) expand a preset into its workload
and parameters; ``--param`` values given beside it win. Each entry cites its source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from firstlight.errors import ConfigError, ConfigProblem

__all__ = ["PRESETS", "Preset", "resolve_preset"]


@dataclass(frozen=True, slots=True)
class Preset:
    """A workload with a published shape's parameters."""

    workload: str
    params: Mapping[str, Any]
    source: str


PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        "llmd-b2b-saas": Preset(
            "W1",
            MappingProxyType(
                {
                    "groups": 150,
                    "system_tokens": 6000,
                    "question_tokens": 1200,
                    "output_tokens": 1000,
                    "length_spread": 0.0,
                }
            ),
            "llm-d's 'KV-Cache Wins You Can See' (blog 2025-09-24) and "
            "llm-d-kv-cache benchmarking/73-capacity: 150 customers x 5 users, 6,000-token "
            "context, 1,200-token questions, 1,000-token outputs (here each request draws "
            "a fresh question of one of the 150 groups)",
        ),
        "sglang-gsp": Preset(
            "W1",
            MappingProxyType(
                {
                    "groups": 64,
                    "system_tokens": 2048,
                    "question_tokens": 128,
                    "output_tokens": 256,
                    "length_spread": 0.0,
                }
            ),
            "SGLang bench_serving --dataset-name generated-shared-prefix defaults: "
            "--gsp-num-groups 64 --gsp-prompts-per-group 16 --gsp-system-prompt-len 2048 "
            "--gsp-question-len 128 --gsp-output-len 256",
        ),
    }
)
"""Every preset by name."""


def resolve_preset(name: str, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The workload and parameters of preset ``name``, ``params`` taking precedence.
    Raises :class:`ConfigError` naming ``preset`` for an unknown name."""
    preset = PRESETS.get(name)
    if preset is None:
        known = ", ".join(PRESETS)
        raise ConfigError([ConfigProblem("preset", f"unknown preset; known: {known}", name, True)])
    return preset.workload, {**preset.params, **params}
