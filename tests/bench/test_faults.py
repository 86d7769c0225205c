"""``firstlight bench faults``: the scenario registry points at real tests whose recorded
figures fill its templates, the ``--figures-out`` plugin stores what a test recorded, and
the page's table says when a run failed or a figure is missing."""

from __future__ import annotations

import json
import re
import string
import subprocess
import sys
from pathlib import Path

import pytest

from firstlight_bench.tools.faults import BEGIN, END, SCENARIOS, Scenario, fill, render, summarize
from tests.bench.bench_cli import run_bench
from tests.bench.pages import shown_section
from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_each_scenario_names_a_test_that_records_its_figures(scenario: Scenario) -> None:
    path, _, name = scenario.test.partition("::")
    source = (REPO_ROOT / path).read_text()
    assert re.search(rf"def {re.escape(name)}\(", source), f"{name} not in {path}"
    assert "record_property" in source
    named = {f for _, f, _, _ in string.Formatter().parse(scenario.measured) if f}
    for figure in named | {"lost"}:
        assert f'"{figure}"' in source, f"{path} never records {figure!r}"


def test_fill_names_a_missing_figure() -> None:
    assert fill("{a} and {b:.1f}", {"a": 1, "b": 2.25}) == "1 and 2.2"
    assert fill("{a} and {b}", {"a": 1}) == "(not measured: b missing)"


def test_the_table_marks_a_failed_or_missing_run() -> None:
    first, second = SCENARIOS[0], SCENARIOS[1]
    records = [{"nodeid": first.test, "outcome": "failed", "duration_s": 3.0, "figures": {}}]
    rows = summarize([first, second], records)
    assert [r["outcome"] for r in rows] == ["failed", "not run"]
    report = {
        "command": "firstlight bench faults",
        "git_commit": "0123456789abcdef0123",
        "time": "2026-12-04T00:00:00+00:00",
        "scenarios": rows,
    }
    table = render(report)
    assert table.startswith(BEGIN)
    assert table.endswith(END)
    first_row = next(line for line in table.splitlines() if line.startswith(f"| {first.fault}"))
    assert "**test failed**" in first_row
    assert "not measured" in first_row
    assert "**test not run**" in table


def test_the_plugin_stores_outcomes_and_recorded_figures(tmp_path: Path) -> None:
    case = tmp_path / "test_case.py"
    case.write_text(
        "def test_records(record_property):\n"
        "    record_property('lost', 0)\n"
        "    record_property('pause_s', 1.5)\n"
        "\n"
        "def test_fails(record_property):\n"
        "    record_property('lost', 3)\n"
        "    assert False\n"
    )
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.figures", "-p", "no:cacheprovider",
         f"--figures-out={out}", "--rootdir", str(tmp_path), str(case)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # one test failed
    records = {r["nodeid"].split("::")[1]: r for r in json.loads(out.read_text())["tests"]}
    assert records["test_records"]["outcome"] == "passed"
    assert records["test_records"]["figures"] == {"lost": 0, "pause_s": 1.5}
    assert records["test_fails"]["outcome"] == "failed"
    assert records["test_fails"]["figures"] == {"lost": 3}


def test_the_reliability_page_shows_the_stored_run() -> None:
    stored = REPO_ROOT / "docs/benchmarks/faults/results.json"
    if not stored.is_file():
        pytest.skip("no faults run stored in docs/benchmarks/faults yet")
    page = (REPO_ROOT / "docs/reliability.md").read_text()
    section = shown_section(page, BEGIN, END)
    assert section == render(json.loads(stored.read_text())), (
        "docs/reliability.md is stale: firstlight bench faults --tables-only "
        "--out docs/benchmarks/faults --page docs/reliability.md"
    )


def test_tables_only_rewrites_the_page_from_the_stored_run(tmp_path: Path) -> None:
    stored = REPO_ROOT / "docs/benchmarks/faults"
    if not (stored / "results.json").is_file():
        pytest.skip("no faults run stored in docs/benchmarks/faults yet")
    page = tmp_path / "reliability.md"
    page.write_text(f"before\n{BEGIN}\nold\n{END}\nafter\n")
    result = run_bench("faults", "--tables-only", "--out", str(stored), "--page", str(page))
    assert result.exit_code == 0, result.output
    report = json.loads((stored / "results.json").read_text())
    assert page.read_text() == f"before\n{render(report)}\nafter\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "migration,meteor"], "--only: unknown scenario(s) meteor"),
        (["--tables-only", "--page", "x.md"], "--tables-only needs --out"),
    ],
)
def test_bad_options_are_refused_before_any_test_runs(argv: list[str], message: str) -> None:
    result = run_bench("faults", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


def test_it_must_run_from_the_repository_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_bench("faults", "--only", "overload")
    assert result.exit_code == 2
    assert "run it from the repository's root" in result.stderr
