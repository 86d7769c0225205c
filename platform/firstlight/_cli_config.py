"""``firstlight config …``: check configuration files and explain their fields
(``validate``, ``to-helm-values``, ``reference``). Mounted by :mod:`firstlight.cli`;
errors as there: 2 for invalid configuration, 1 for any other failure.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
import yaml

from firstlight._console import fail as _fail
from firstlight._console import load as _load
from firstlight._console import stderr as _stderr
from firstlight.errors import FirstlightError

__all__ = ["config_app"]

config_app = typer.Typer(
    help="Check configuration files and explain their fields.", no_args_is_help=True
)


class OutputFormat(StrEnum):
    """Formats ``config validate`` prints the resolved configuration in."""

    yaml = "yaml"
    json = "json"


@config_app.command("validate")
def validate(
    file: Annotated[Path, typer.Argument(help="YAML configuration file.")],
    output: Annotated[
        OutputFormat, typer.Option("--output", "-o", help="Format of the resolved config.")
    ] = OutputFormat.yaml,
) -> None:
    """Validate FILE (plus FIRSTLIGHT__* overrides) and print the resolved configuration,
    with any credentials in a URL masked (``redis://***@host``).

    Exits 2 and lists every problem with its field path and value when it is invalid.
    """
    cfg = _load(file)
    data = _without_credentials(cfg.model_dump(mode="json"))
    if output is OutputFormat.json:
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
    regions = ", ".join(r.name for r in cfg.regions)
    _stderr.print(
        f"valid: {file} (mode {cfg.mode}; regions {regions}; {len(cfg.models)} model(s))",
        markup=False,
    )


def _without_credentials(value: object) -> object:
    """``value`` (a config dump) with the user and password of every URL replaced by
    ``***``: a ``redis_url`` may carry them, and what ``config validate`` prints ends
    up in terminals, CI logs and tickets."""
    if isinstance(value, dict):
        return {k: _without_credentials(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_credentials(v) for v in value]
    if isinstance(value, str) and "://" in value and "@" in value:
        scheme, _, rest = value.partition("://")
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"
    return value


@config_app.command("to-helm-values")
def to_helm_values(
    file: Annotated[Path, typer.Argument(help="YAML configuration file.")],
    region: Annotated[
        str | None, typer.Option(help="Region to write values for (default: the config's).")
    ] = None,
) -> None:
    """Print the Helm chart's values for one region of FILE (helm/firstlight).

    Only settings that differ from the defaults are written. What the chart takes from
    Kubernetes Secrets instead (API keys, a Redis password) is listed on stderr with the
    ``kubectl`` command that creates it.
    """
    from firstlight.k8s.helm_values import to_helm_values as build_values

    cfg = _load(file)
    try:
        result = build_values(cfg, region)
    except FirstlightError as exc:
        _fail(exc)
    name = result.values["region"]["name"]
    typer.echo(f"# Helm values for region {name}, from {file} (firstlight config to-helm-values)")
    typer.echo(yaml.safe_dump(result.values, sort_keys=False), nl=False)
    for note in result.notes:
        _stderr.print(f"note: {note}", markup=False)


@config_app.command("reference")
def reference() -> None:
    """Print every configuration field with its type, bounds, default and meaning."""
    from firstlight._config_reference import config_reference_markdown

    typer.echo(config_reference_markdown(), nl=False)
