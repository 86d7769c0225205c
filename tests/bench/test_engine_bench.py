"""The engine benchmark's report (run on the simulator, which has no engine processes of
its own) and the idle-CPU section of docs/serving.md, held to the stored report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstlight_bench.engine import IDLE_BEGIN, IDLE_END, emit, main, render_idle
from tests.bench.pages import shown_section

REPO = Path(__file__).parents[2]
STORED = REPO / "docs" / "benchmarks" / "engine-idle" / "results.json"


@pytest.mark.slow
def test_a_run_stores_its_report_and_rewrites_the_idle_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"before\n{IDLE_BEGIN}\nold\n{IDLE_END}\nafter\n")
    out = tmp_path / "results.json"
    argv = ["--engine", "sim", "--repeats", "1", "--prompt-tokens", "64"]
    argv += ["--cached-tokens", "32", "--output-tokens", "2", "--concurrency", "1"]
    report = main([*argv, "--out", str(out), "--page", str(page)])
    capsys.readouterr()
    assert json.loads(out.read_text()) == report
    assert report["meta"]["command"].startswith("firstlight bench engine --engine sim")
    # The simulator runs in this process: no engine process burns anything once idle.
    assert report["idle_cpu_cores"] == {"0-1s": 0.0, "1-2s": 0.0, "2-5s": 0.0}
    text = page.read_text()
    assert text.startswith("before\n" + IDLE_BEGIN)
    assert text.endswith(IDLE_END + "\nafter\n")
    assert "| 0.00 | 0.00 | 0.00 |" in text


def test_the_page_flag_needs_a_stored_report(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--engine", "sim", "--page", "x.md"])
    assert exc.value.code == 2
    assert "--page needs --out" in capsys.readouterr().err


def test_the_serving_page_shows_exactly_the_stored_idle_report() -> None:
    page = (REPO / "docs" / "serving.md").read_text()
    shown = shown_section(page, IDLE_BEGIN, IDLE_END)
    report = json.loads(STORED.read_text())
    assert shown == render_idle(report), "docs/serving.md is stale: rerun the command it names"
    assert report["meta"]["engine"] == "vllm"
    assert not report["meta"]["git_commit"].endswith("-dirty")


def test_emit_creates_the_folder_it_stores_into(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "not-yet" / "results.json"
    emit({"meta": {"command": "x"}}, out)
    assert json.loads(out.read_text()) == {"meta": {"command": "x"}}
    assert '"command": "x"' in capsys.readouterr().out
