"""Options the benchmark's commands share, declared once, and the helpers that check them.

Each ``firstlight bench`` command (:mod:`firstlight_bench.cli` lists them) declares its
options as typer parameters; the ones several commands take are typed here so that their
name, help and bounds read the same everywhere. A bad value is refused by typer before
the command runs (exit 2, naming the option), or by the command with
:class:`typer.BadParameter` for what one option's type cannot say (a combination of two).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

__all__ = [
    "EngineKind",
    "OutOption",
    "PageOption",
    "PageTablesOnlyOption",
    "SeedOption",
    "TablesOnlyOption",
    "command_line",
    "csv_arms",
    "csv_ints",
    "csv_loads",
    "csv_seeds",
    "page_needs_out",
    "parse_params",
    "parse_route_share_ms",
    "rewrote_tables",
    "tables_page",
]


class EngineKind(StrEnum):
    """What serves the model in a tool's run (``--engine``): vLLM (CPU or GPU), or the
    simulator in real time (its runs are labelled simulated)."""

    VLLM = "vllm"
    SIM = "sim"


OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out", help="Store the report as OUT/results.json, with the commit and the command."
    ),
]
PageOption = Annotated[
    Path | None,
    typer.Option(
        "--page", help="Rewrite this page's generated section from the report stored in --out."
    ),
]
SeedOption = Annotated[int, typer.Option("--seed", min=0, help="Random seed.")]
PageTablesOnlyOption = Annotated[
    bool,
    typer.Option(
        "--tables-only",
        help="Measure nothing: rewrite --page's sections from the reports stored beside it.",
    ),
]
"""For a tool whose page shows several stored runs (serving, peers, features, data-path):
the reports are found beside the page, so only ``--page`` is needed
(:func:`tables_page`)."""
TablesOnlyOption = Annotated[
    bool,
    typer.Option(
        "--tables-only",
        help="Measure nothing: rewrite --page's section from the report stored in --out.",
    ),
]


def command_line() -> str:
    """The command as typed (``firstlight bench ...``), for a stored report's meta."""
    return "firstlight " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def page_needs_out(out: Path | None, page: Path | None) -> None:
    """Refuse ``--page`` without ``--out``: a page's section is made from the stored
    report, never from an unstored run."""
    if page is not None and out is None:
        raise typer.BadParameter(
            "--page needs --out (the section is made from the stored report)",
            param_hint="--page",
        )


def csv_ints(text: str, option: str, *, least: int = 1) -> list[int]:
    """``"8,64,256"`` → ``[8, 64, 256]``; each at least ``least``, or a
    :class:`typer.BadParameter` naming ``option``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint=option) from exc
    if not values or min(values) < least:
        raise typer.BadParameter(
            f"{text!r}: comma-separated integers, each at least {least}", param_hint=option
        )
    return values


def tables_page(page: Path | None) -> Path:
    """The page ``--tables-only`` rewrites (:data:`PageTablesOnlyOption`), or a
    :class:`typer.BadParameter` when ``--page`` is missing."""
    if page is None:
        raise typer.BadParameter("--tables-only needs --page", param_hint="--tables-only")
    return page


def rewrote_tables(
    out: Path | None,
    page: Path | None,
    tables_only: bool,
    rewrite: Callable[[Path, dict[str, Any]], None],
) -> bool:
    """With ``--tables-only``: ``rewrite`` the page from the report stored in ``--out``
    (the command then stops); without it, ``False``. Refuses ``--tables-only`` without
    both ``--out`` and ``--page`` (:class:`typer.BadParameter`)."""
    from firstlight_bench.reports.results import read_report

    if not tables_only:
        return False
    if page is None or out is None:
        raise typer.BadParameter(
            "--tables-only needs --out (the stored report) and --page",
            param_hint="--tables-only",
        )
    rewrite(page, read_report(out))
    return True


def parse_params(items: list[str]) -> dict[str, Any]:
    """``["groups=128", "zipf_s=1.2"]`` → ``{"groups": 128, "zipf_s": 1.2}`` (values
    read as YAML scalars). Raises ``typer.BadParameter`` for an item without ``=``."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: expected NAME=VALUE", param_hint="--param")
        params[key.strip()] = yaml.safe_load(value)
    return params


def csv_loads(text: str, name: str) -> list[float]:
    """``"0.5,1.0"`` → ``[0.5, 1.0]``: offered loads, each in (0, 10]; refused naming
    ``name`` otherwise."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint=name) from exc
    if not values or any(not 0 < v <= 10 for v in values):
        raise typer.BadParameter(f"{text!r}: loads must be in (0, 10]", param_hint=name)
    return values


def parse_route_share_ms(text: str) -> float | None:
    """``--route-share-ms``: milliseconds in [0, 10000], or ``off`` (``None``)."""
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint="--route-share-ms") from exc
    if not 0 <= value <= 10_000:
        raise typer.BadParameter(
            f"{text!r}: milliseconds in [0, 10000], or 'off'", param_hint="--route-share-ms"
        )
    return value


def csv_seeds(text: str) -> list[int]:
    """``--seeds``: distinct non-negative integers, at least one."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint="--seeds") from exc
    if not values or len(set(values)) != len(values) or min(values) < 0:
        raise typer.BadParameter(
            f"{text!r}: distinct non-negative integers, at least one", param_hint="--seeds"
        )
    return values


def csv_arms(text: str) -> list[str]:
    """``--arms``: distinct names of the simulator's arms, at least one."""
    from firstlight_bench.simulator.cluster import ARMS

    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown or len(set(arms)) != len(arms):
        problem = f"unknown {', '.join(unknown)}" if unknown else "empty or repeated"
        raise typer.BadParameter(
            f"{text!r}: {problem}; arms are {', '.join(ARMS)}", param_hint="--arms"
        )
    return arms
