"""The data-path spike's page section: docs/architecture.md shows exactly the stored run,
from a clean commit, with every path measured."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from firstlight_bench.reports.data_path_report import PATHS, markers, render_markdown
from tests.bench.bench_cli import run_bench
from tests.bench.pages import shown_section
from tests.bench.test_serving_bench import REPO


def test_the_architecture_page_shows_exactly_the_stored_data_path_run() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    assert re.findall(r"<!-- data-path:([\w-]+):begin", page) == ["data-path"]
    report = json.loads((REPO / "docs" / "benchmarks" / "data-path" / "results.json").read_text())
    begin, end = markers("data-path")
    assert shown_section(page, begin, end) == render_markdown(report, "data-path")
    assert not report["meta"]["git_commit"].endswith("-dirty")
    assert set(report["paths"]) == set(PATHS) == set(report["requests_per_s"])
    assert "--out docs/benchmarks/data-path" in report["meta"]["command"]  # no local path


def test_tables_only_rewrites_each_section_from_the_run_stored_beside_the_page(
    tmp_path: Path,
) -> None:
    stored = tmp_path / "benchmarks" / "data-path"
    stored.mkdir(parents=True)
    shutil.copy(REPO / "docs" / "benchmarks" / "data-path" / "results.json", stored)
    begin, end = markers("data-path")
    page = tmp_path / "architecture.md"
    page.write_text(f"before\n{begin}\nold\n{end}\nafter\n")
    result = run_bench("data-path", "--tables-only", "--page", str(page))
    assert result.exit_code == 0, result.output
    report = json.loads((stored / "results.json").read_text())
    assert page.read_text() == f"before\n{render_markdown(report, 'data-path')}\nafter\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tables-only"], "--tables-only needs --page"),
        (["--requests", "0"], "'--requests'"),
        (["--items", "0"], "'--items'"),
        (["--concurrency", "0"], "'--concurrency'"),
        (["--duration", "soon"], "'--duration'"),
    ],
)
def test_bad_options_are_refused_before_ray_starts(argv: list[str], message: str) -> None:
    result = run_bench("data-path", *argv)
    assert result.exit_code == 2
    assert message in result.stderr
