"""``firstlight status``: every region's RayService, Serve applications, replicas and endpoint.

The main CLI (:mod:`firstlight.cli`) registers :func:`status` with
``app.command("status")(status)``. It resolves the kubeconfig and the contexts, calls
:func:`firstlight.k8s.status.collect_status` and prints a table or JSON to stdout;
errors go to stderr. Exit codes: 0; 1 with ``--check`` when a context could not be read
or a region is unhealthy; 2 when the kubeconfig is missing or unreadable or a
``--context`` is not in it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from firstlight.k8s._model import FIRSTLIGHT_SELECTOR, ContextStatus, RegionStatus

__all__ = ["StatusOutput", "render_table", "status"]

EXIT_UNHEALTHY = 1
EXIT_BAD_KUBECONFIG = 2


class StatusOutput(StrEnum):
    """Formats ``firstlight status`` prints in."""

    table = "table"
    json = "json"


def status(
    context: Annotated[
        list[str] | None,
        typer.Option(
            "--context",
            metavar="NAME",
            help="Kube context to query (repeatable; default: every context).",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH", help="Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)."
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", metavar="NS", help="Only this namespace (default: all)."),
    ] = None,
    output: Annotated[
        StatusOutput, typer.Option("--output", "-o", help="table or json.")
    ] = StatusOutput.table,
    timeout: Annotated[
        float, typer.Option(min=0.1, metavar="SECONDS", help="Seconds allowed for each API call.")
    ] = 10.0,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Exit 1 if a context cannot be read or a region is unhealthy."
        ),
    ] = False,
) -> None:
    """Show each region's RayService, Serve applications, replicas and endpoint (read-only)."""
    stderr = Console(stderr=True, highlight=False, soft_wrap=True)
    # The kubernetes client takes a third of a second to import: only when asked.
    from firstlight.k8s.status import (
        KubeconfigError,
        collect_status,
        kubeconfig_path,
        resolve_contexts,
    )

    path = kubeconfig_path(kubeconfig)
    try:
        contexts = resolve_contexts(path, context or ())
    except KubeconfigError as exc:
        stderr.print(f"error: {exc}", markup=False)
        raise typer.Exit(EXIT_BAD_KUBECONFIG) from None
    results = collect_status(contexts, path, namespace=namespace, timeout_s=timeout)
    if output is StatusOutput.json:
        typer.echo(json.dumps([result.to_json() for result in results], indent=2))
    else:
        Console(highlight=False).print(render_table(results))
    if check and not all(result.healthy for result in results):
        raise typer.Exit(EXIT_UNHEALTHY)


def render_table(results: Sequence[ContextStatus]) -> Table:
    """One row per region (or per context that could not be read), for :func:`status`."""
    table = Table(show_lines=True)
    for column in ("context", "region"):
        table.add_column(column)
    table.add_column("rayservice", max_width=60, overflow="fold")  # also holds a context's error
    for column in ("service", "apps"):
        table.add_column(column)
    table.add_column("deployments", max_width=60, overflow="fold")  # and why replicas are "?"
    table.add_column("endpoint", overflow="fold")
    for result in results:
        if result.error is not None:
            label = "unreachable" if not result.reachable else "error"
            table.add_row(
                result.context,
                Text(label, style="bold red"),
                Text(result.error, style="red"),
            )
        elif not result.regions:
            note = f"no RayService labelled {FIRSTLIGHT_SELECTOR}"
            table.add_row(result.context, Text("-", style="dim"), Text(note, style="dim"))
        for region in result.regions:
            table.add_row(result.context, *_region_cells(region))
    return table


def _region_cells(region: RegionStatus) -> list[Text]:
    service = Text(region.service_status or "not running", style=_style(region.ready))
    for condition in region.conditions:
        if condition.type == "Ready" and condition.status != "True":
            service.append(f"\nReady={condition.status} {condition.reason}".rstrip())
    apps = Text()
    deployments = Text()
    for app in region.applications:
        apps.append(f"{app.name}: {app.status or '?'}\n", style=_style(app.status == "RUNNING"))
        if app.message and app.status != "RUNNING":
            apps.append(f"{app.message}\n", style="dim")
        for dep in app.deployments:
            deployments.append(f"{dep.name} {dep.replicas_text} {dep.status or '?'}\n")
    if region.replicas_error is not None:
        deployments.append(f"replicas unknown: {region.replicas_error}", style="yellow")
    if region.endpoint is not None:
        endpoint = Text(region.endpoint)
    elif region.endpoint_error is not None:
        endpoint = Text(f"unknown: {region.endpoint_error}", style="yellow")
    else:
        endpoint = Text("none", style="dim")
    name = Text(f"{region.namespace}/{region.name}")
    region_text = Text(region.region, style=_style(region.healthy))
    return [region_text, name, service, _strip(apps), _strip(deployments), endpoint]


def _strip(text: Text) -> Text:
    text.rstrip()
    return text if text.plain else Text("-")


def _style(good: bool) -> str:
    return "green" if good else "red"
