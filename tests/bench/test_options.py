"""The options the benchmark's commands share (``firstlight_bench.options``): what each
refuses, naming the option, and the stored report's head recording the command."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import typer

from firstlight_bench.options import (
    csv_ints,
    csv_loads,
    csv_seeds,
    page_needs_out,
    parse_params,
    rewrote_tables,
    tables_page,
)
from firstlight_bench.reports.results import run_header


def test_tables_only_rewrites_the_page_from_the_stored_report(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text('{"figure": 42}')
    seen: list[tuple[Path, dict[str, object]]] = []

    def rewrite(page: Path, report: dict[str, object]) -> None:
        seen.append((page, report))

    assert not rewrote_tables(tmp_path, Path("p.md"), False, rewrite)
    assert seen == []
    assert rewrote_tables(tmp_path, Path("p.md"), True, rewrite)
    assert seen == [(Path("p.md"), {"figure": 42})]
    for out, page in [(None, Path("p.md")), (tmp_path, None)]:
        with pytest.raises(typer.BadParameter, match=r"needs --out .* and --page"):
            rewrote_tables(out, page, True, rewrite)
    assert len(seen) == 1


def test_a_page_of_stored_runs_needs_only_the_page() -> None:
    assert tables_page(Path("docs/serving.md")) == Path("docs/serving.md")
    with pytest.raises(typer.BadParameter) as caught:
        tables_page(None)
    assert caught.value.param_hint == "--tables-only"


def test_a_page_is_made_from_a_stored_report_only() -> None:
    page_needs_out(Path("out"), Path("p.md"))
    page_needs_out(None, None)
    with pytest.raises(typer.BadParameter, match="--page needs --out"):
        page_needs_out(None, Path("p.md"))


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        (lambda t: csv_ints(t, "--n"), "8, 64,256", [8, 64, 256]),
        (lambda t: csv_loads(t, "--loads"), "0.5,1.2", [0.5, 1.2]),
        (csv_seeds, "0,7", [0, 7]),
    ],
)
def test_lists_are_read_from_commas(
    parse: Callable[[str], object], text: str, expected: list[float]
) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("parse", "text", "option"),
    [
        (lambda t: csv_ints(t, "--replicas"), "8,x", "--replicas"),
        (lambda t: csv_ints(t, "--replicas"), "0", "--replicas"),
        (lambda t: csv_ints(t, "--replicas"), "", "--replicas"),
        (lambda t: csv_loads(t, "--loads"), "0", "--loads"),
        (lambda t: csv_loads(t, "--loads"), "10.5", "--loads"),
        (csv_seeds, "1,1", "--seeds"),
        (csv_seeds, "-1", "--seeds"),
        (lambda t: parse_params([t]), "groups", "--param"),
    ],
)
def test_a_bad_list_is_refused_naming_its_option(
    parse: Callable[[str], object], text: str, option: str
) -> None:
    with pytest.raises(typer.BadParameter) as caught:
        parse(text)
    assert caught.value.param_hint == option


def test_params_are_yaml_scalars() -> None:
    assert parse_params(["groups=128", "zipf_s=1.2", "name=w"]) == {
        "groups": 128,
        "zipf_s": 1.2,
        "name": "w",
    }


def test_a_reports_head_records_the_command_as_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["firstlight", "bench", "rag", "--questions", "a b"])
    head = run_header()
    assert head["command"] == "firstlight bench rag --questions 'a b'"
    assert {"git_commit", "time", "machine"} <= set(head)
