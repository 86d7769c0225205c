"""Loading the configuration: a YAML file or a mapping, then ``FIRSTLIGHT__*`` environment
overrides, validated into a :class:`~firstlight.config.PlatformConfig`; every problem
is reported at once as a :class:`~firstlight.errors.ConfigError` naming the field path
and the offending value.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from firstlight.config._base import FieldValueError
from firstlight.config.sections import ENV_PREFIX, PlatformConfig
from firstlight.errors import ConfigError, ConfigProblem

__all__ = ["load_config", "load_config_data", "parse_config", "validation_problems"]


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> PlatformConfig:
    """Load a configuration from a YAML file (or defaults) plus environment overrides.

    Called by the CLI and the app builders. Raises :class:`ConfigError` listing every
    problem: unreadable file, malformed YAML, bad override, invalid field.
    """
    source = str(path) if path is not None else "defaults"
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    return load_config_data(data, source, environ)


def load_config_data(
    data: Mapping[str, Any], source: str, environ: Mapping[str, str] | None = None
) -> PlatformConfig:
    """Like :func:`load_config` for an already-parsed mapping, such as the config a
    RayService passes inline in ``serveConfigV2`` (``build_app``). ``data`` is copied,
    not changed. Raises :class:`ConfigError`."""
    mutable: dict[str, Any] = copy.deepcopy(dict(data))
    overrides = _env_overrides(os.environ if environ is None else environ)
    problems = [_apply_override(mutable, name, value) for name, value in overrides]
    failed = [p for p in problems if p is not None]
    if failed:
        raise ConfigError(failed, source)
    return parse_config(mutable, source)


def parse_config(data: Mapping[str, Any], source: str | None = None) -> PlatformConfig:
    """Validate an already-parsed mapping; raises :class:`ConfigError`."""
    try:
        return PlatformConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc), source) from exc


def validation_problems(exc: ValidationError, prefix: str = "") -> list[ConfigProblem]:
    """Turn pydantic's errors into problems named by field path (under ``prefix``).

    Also used by components that validate their own section later, such as routing
    policies checking ``router.params``.
    """
    errors = exc.errors()
    item_locs = [err["loc"] for err in errors]
    problems = []
    for err in errors:
        # A list whose item failed also reports itself "too short"; that is an echo.
        echo = err["type"] == "too_short" and any(
            loc[: len(err["loc"])] == err["loc"] != loc for loc in item_locs
        )
        if not echo:
            problem = _problem(err)
            if prefix:
                path = f"{prefix}.{problem.path}" if problem.path else prefix
                problem = ConfigProblem(path, problem.message, problem.value, problem.has_value)
            problems.append(problem)
    return problems


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        problem = ConfigProblem("", f"cannot read file: {exc.strerror}")
        raise ConfigError([problem], str(path)) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = getattr(exc, "problem", None) or str(exc)
        problem = ConfigProblem("", f"malformed YAML{where}: {reason}")
        raise ConfigError([problem], str(path)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        problem = ConfigProblem("", f"the document must be a mapping, not {type(data).__name__}")
        raise ConfigError([problem], str(path))
    return data


def _env_overrides(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    return sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIX))


def _apply_override(data: dict[str, Any], name: str, raw: str) -> ConfigProblem | None:
    """Set the field named by environment variable ``name``; return a problem or None."""
    segments = [s.lower() for s in name[len(ENV_PREFIX) :].split("__")]
    if not all(segments):
        return ConfigProblem(name, "empty path segment in environment override")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    node: Any = data
    for depth, segment in enumerate(segments):
        last = depth == len(segments) - 1
        here = ".".join(segments[: depth + 1])
        if isinstance(node, list):
            if not segment.isdigit() or int(segment) >= len(node):
                return ConfigProblem(name, f"{here}: no list item {segment!r} to override")
            if last:
                node[int(segment)] = value
            else:
                node = node[int(segment)]
        elif isinstance(node, dict):
            if last:
                node[segment] = value
            else:
                node = node.setdefault(segment, {})
        else:
            return ConfigProblem(name, f"{here}: cannot override inside a scalar value")
    return None


def _problem(err: Any) -> ConfigProblem:
    path = _format_loc(err["loc"])
    inner = err.get("ctx", {}).get("error")
    if isinstance(inner, FieldValueError):
        full = f"{path}.{inner.path}" if path else inner.path
        return ConfigProblem(full, inner.message, inner.value, True)
    if err["type"] == "missing":
        return ConfigProblem(path, "field required")
    message = str(err["msg"])
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    return ConfigProblem(path, message, err.get("input"), True)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
