"""The decision-time benchmark: its stored report, the page's table made from it, and its
command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstlight_bench.tools.decision import BEGIN, END, render_table, replace_table
from tests.bench.bench_cli import run_bench
from tests.bench.pages import shown_section

REPO = Path(__file__).parents[2]
PAGE = REPO / "docs" / "routing.md"
STORED = REPO / "docs" / "benchmarks" / "decision" / "results.json"


def test_the_routing_page_shows_exactly_the_stored_report() -> None:
    page = PAGE.read_text()
    assert shown_section(page, BEGIN, END) == render_table(json.loads(STORED.read_text())), (
        "docs/routing.md is stale: rerun the command its table names"
    )


def test_the_stored_report_is_from_a_clean_commit_at_8_64_and_256_replicas() -> None:
    report = json.loads(STORED.read_text())
    assert not report["meta"]["git_commit"].endswith("-dirty")
    assert list(report["decision_us"]) == ["8", "64", "256"]
    assert {"firstlight", "llmd_sticky", "dynamo_kv"} <= set(report["decision_us"]["64"])


def test_a_run_stores_its_report_and_rewrites_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"before\n{BEGIN}\nold\n{END}\nafter\n")
    argv = ["--replicas", "4", "--requests", "30", "--policies", "firstlight,least_queue"]
    argv += ["--runs", "3", "--clock", "cpu", "--out", str(tmp_path / "run"), "--page", str(page)]
    result = run_bench("decision", *argv)
    assert result.exit_code == 0, result.output
    stored = json.loads((tmp_path / "run" / "results.json").read_text())
    assert json.loads(result.stdout) == stored
    assert stored["meta"]["command"].startswith("firstlight bench decision --replicas 4")
    assert stored["meta"]["clock"] == "cpu"
    assert stored["meta"]["command"].endswith("--page " + str(page))
    row = stored["decision_us"]["4"]
    assert set(row) == {"firstlight", "least_queue"}
    assert stored["meta"]["runs"] == 3
    first = row["firstlight"]
    assert 0 < first["p50"] <= first["p99"]
    assert first["p99_min"] <= first["p99"] <= first["p99_max"]
    text = page.read_text()
    assert text.startswith("before\n" + BEGIN)
    assert text.endswith(END + "\nafter\n")
    assert "| 4 | " in text
    assert "cpu clock" in text
    assert "median of 3 runs" in text
    assert f"({first['p99_min']:g} to {first['p99_max']:g})" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--page", "x.md"], "--page needs --out"),
        (["--policies", "firstlight,fastest"], "unknown policies fastest"),
        (["--runs", "0"], "'--runs'"),
        (["--replicas", "8,x"], "--replicas"),
        (["--clock", "sundial"], "'--clock'"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("decision", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


def test_a_page_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        replace_table("no markers", f"{BEGIN}\n{END}")
