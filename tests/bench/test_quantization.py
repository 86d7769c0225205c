"""``firstlight bench quantization``'s command line: its options and their defaults, a
bad one refused by name before any engine starts, and the stored run's command line
still parsing to the options it ran with. (The run itself is the published one of
docs/engines.md, whose table ``test_engine_bench.py`` holds.)"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import typer

from firstlight_bench.tools.quantization import ReferenceDtype, app
from tests.bench.bench_cli import run_bench

REPO = Path(__file__).parents[2]
STORED = REPO / "docs" / "benchmarks" / "quantization-vllm-cpu" / "results.json"


def test_help_lists_every_option_with_its_default() -> None:
    result = run_bench("quantization", "--help")
    assert result.exit_code == 0, result.output
    for option in ("--repeats", "--reference-dtype", "--out"):
        assert option in result.stdout
    assert "float32|bfloat16" in result.stdout
    assert "[default: 10]" in result.stdout
    assert "[default: float32]" in result.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reference-dtype", "float16"], "'--reference-dtype'"),
        (["--repeats", "0"], "'--repeats'"),
        (["--repeats", "many"], "'--repeats'"),
        (["--out"], "'--out' requires an argument"),
        (["--dtype", "float32"], "No such option: --dtype"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("quantization", *argv)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_the_stored_runs_command_line_still_parses_to_its_options() -> None:
    report = json.loads(STORED.read_text())
    words = shlex.split(report["meta"]["command"])
    assert words[:3] == ["firstlight", "bench", "quantization"]
    params = typer.main.get_command(app).make_context("quantization", words[3:]).params
    assert params["out"] == Path("docs/benchmarks/quantization-vllm-cpu/results.json")
    assert params["repeats"] == 10
    assert params["reference_dtype"] is ReferenceDtype.FLOAT32
    assert report["reference"]["dtype"] == params["reference_dtype"].value
