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
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = [
    "OutOption",
    "PageOption",
    "SeedOption",
    "TablesOnlyOption",
    "command_line",
    "csv_ints",
    "page_needs_out",
    "rewrote_tables",
]

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


def rewrote_tables(
    out: Path | None,
    page: Path | None,
    tables_only: bool,
    rewrite: Callable[[Path, dict[str, Any]], None],
) -> bool:
    """With ``--tables-only``: ``rewrite`` the page from the report stored in ``--out``
    (the command then stops); without it, ``False``. Refuses ``--tables-only`` without
    both ``--out`` and ``--page`` (:class:`typer.BadParameter`)."""
    from firstlight_bench.results import read_report

    if not tables_only:
        return False
    if page is None or out is None:
        raise typer.BadParameter(
            "--tables-only needs --out (the stored report) and --page",
            param_hint="--tables-only",
        )
    rewrite(page, read_report(out))
    return True
