"""``firstlight bench sim`` through the real CLI, in process: the run folder, its
metadata, ``--describe`` and bad options."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from firstlight.cli import app
from firstlight_bench.reports.results import validate_results

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _sim_args(out: Path) -> list[str]:
    return [
        "bench", "sim", "--out", str(out), "--workload", "W1", "--regions", "2",
        "--replicas", "2", "--arms", "firstlight,round_robin", "--loads", "0.5,1.0",
        "--requests", "80", "--param", "groups=4", "--seeds", "0,5", "--jobs", "2",
    ]  # fmt: skip


def test_bench_sim_writes_a_valid_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    args = _sim_args(out)
    # What the console script sees; the command records sys.argv.
    monkeypatch.setattr(sys, "argv", ["firstlight", *args])

    result = runner.invoke(app, args)

    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    validate_results(data)

    points = data["points"]
    assert len(points) == 8
    assert {(p["arm"], p["load"], p["seed"]) for p in points} == {
        (arm, load, seed)
        for arm in ("firstlight", "round_robin")
        for load in (0.5, 1.0)
        for seed in (0, 5)
    }
    for point in points:
        assert (point["completed"], point["errors"]) == (80, 0)
        # The floor is a lower bound for every request, so for every percentile too.
        assert all(ratio >= 0.999 for ratio in point["ttft_vs_floor"].values()), point
    # Each seed is its own trace; the arms of one (seed, load) share one floor.
    floors = {(p["seed"], p["load"]): p["floor_ttft_ms"]["p90"] for p in points}
    assert floors[(0, 0.5)] != floors[(5, 0.5)]
    assert len({p["floor_ttft_ms"]["p90"] for p in points}) == len(floors)

    meta = data["meta"]
    assert (meta["seed"], meta["seeds"]) == (0, [0, 5])
    assert meta["simulated"] is True
    assert meta["git_commit"]  # a commit, "-dirty" or "unknown": never empty
    assert meta["command"] == "firstlight " + shlex.join(args)
    assert meta["workload"]["name"] == "W1"
    assert meta["workload"]["requests"] == 80
    assert meta["workload"]["params"]["groups"] == 4
    config = meta["config"]
    assert (config["regions"], config["replicas_per_region"]) == (2, 2)
    assert config["arms"] == ["firstlight", "round_robin"]
    assert config["loads"] == [0.5, 1.0]
    assert config["capacity_rps"] > 0

    report = (out / "report.md").read_text()
    assert "Each row is the mean over 2 seeds" in report
    assert "p90 vs best other" in report
    assert "TTFT p90 ÷ floor" in report
    for name in ("ttft_vs_load", "hit_rate_vs_load", "goodput_vs_load"):
        assert (out / f"{name}.png").read_bytes().startswith(PNG_MAGIC), name
    # The written paths are listed on stdout.
    assert str(out / "results.json") in result.stdout


def test_describe_prints_the_workload_parameters(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["bench", "sim", "--out", str(tmp_path / "x"), "--workload", "W4", "--describe"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("W4:")
    for name in ("groups = 256", "system_tokens", "question_tokens", "zipf_s = 1.1"):
        assert name in result.stdout
    assert not (tmp_path / "x").exists()


def test_describe_needs_no_out_folder_but_a_run_does(tmp_path: Path) -> None:
    described = runner.invoke(app, ["bench", "sim", "--describe", "--workload", "W3"])
    assert described.exit_code == 0, described.output
    assert "W3" in described.stdout
    missing = runner.invoke(app, ["bench", "sim", "--requests", "10"])
    assert missing.exit_code == 2
    assert "--out" in missing.stderr


def test_unknown_workload_parameter_is_named(tmp_path: Path) -> None:
    out = tmp_path / "x"
    result = runner.invoke(
        app, ["bench", "sim", "--out", str(out), "--requests", "10", "--param", "nosuch=1"]
    )
    assert result.exit_code == 2
    assert "W1.nosuch" in result.stderr
    assert "Traceback" not in result.output
    assert not (out / "results.json").exists()


@pytest.mark.parametrize("loads", ["0", "0.5,0", "-1", "11", "abc", ","])
def test_bad_loads_are_rejected(tmp_path: Path, loads: str) -> None:
    out = tmp_path / "x"
    result = runner.invoke(app, ["bench", "sim", "--out", str(out), "--loads", loads])
    assert result.exit_code == 2
    assert "--loads" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("share", ["fast", "-1", "20000"])
def test_a_bad_route_share_delay_is_rejected(tmp_path: Path, share: str) -> None:
    out = tmp_path / "x"
    args = ["bench", "sim", "--out", str(out), "--gateways", "2", "--route-share-ms", share]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "--route-share-ms" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--arms", ","),
        ("--arms", "round_robin,round_robin"),
        ("--loads", "0.5,0.5"),
        ("--seeds", "1,1"),
        ("--seeds", "x"),
        ("--seeds", "-1"),
    ],
    ids=["no-arms", "repeated-arm", "repeated-load", "repeated-seed", "bad-seed", "negative"],
)
def test_empty_or_repeated_arms_and_loads_fail_cleanly_before_the_sweep(
    tmp_path: Path, option: str, value: str
) -> None:
    """BUG: today the whole sweep runs, then write_run's validate_results raises an
    uncaught ValueError ("$.points: [] should be non-empty" / "... repeats
    $.points[0]"): exit 1, a traceback, nothing written. Reject (exit 2, naming the
    option) before simulating, or drop the repeats and write the run."""
    out = tmp_path / "x"
    args = ["bench", "sim", "--out", str(out), "--requests", "10", "--regions", "1",
            "--replicas", "1", "--arms", "round_robin", option, value]  # fmt: skip
    result = runner.invoke(app, args)
    assert not isinstance(result.exception, ValueError), repr(result.exception)
    if result.exit_code == 0:  # repeats dropped
        validate_results(json.loads((out / "results.json").read_text()))
    else:
        assert result.exit_code == 2
        assert option in result.stderr
        assert "capacity estimate" not in result.stderr  # rejected before simulating


@pytest.mark.parametrize(
    ("arms", "expected_code", "named"),
    [
        ("firstlight,skywalker", 2, "skywalker"),
        ("round_robin,round_robin", 2, "--arms"),
    ],
    ids=["simulator-only-arm", "repeated-arm"],
)
def test_bench_live_refuses_bad_arms_before_deploying(
    tmp_path: Path, arms: str, expected_code: int, named: str
) -> None:
    out = tmp_path / "x"
    args = ["bench", "live", "--out", str(out), "--engine", "sim", "--arms", arms]
    result = runner.invoke(app, args)
    assert result.exit_code == expected_code, result.output
    assert named in result.stderr
    assert "deploying" not in result.stderr
    assert "Traceback" not in result.output
    assert not out.exists()


def test_a_preset_expands_into_its_workload_and_parameters(tmp_path: Path) -> None:
    described = runner.invoke(app, ["bench", "sim", "--preset", "sglang-gsp", "--describe"])
    assert described.exit_code == 0, described.output
    assert described.stdout.startswith("W1:")
    out = tmp_path / "run"
    args = ["bench", "sim", "--out", str(out), "--preset", "sglang-gsp", "--param", "groups=4",
            "--param", "system_tokens=256", "--regions", "1", "--replicas", "2", "--arms",
            "least_queue", "--loads", "0.5", "--requests", "40", "--seeds", "0"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    params = json.loads((out / "results.json").read_text())["meta"]["workload"]["params"]
    # The preset's shape, with the explicit --param values winning.
    assert (params["groups"], params["system_tokens"]) == (4, 256)
    assert (params["question_tokens"], params["output_tokens"]) == (128, 256)
    assert params["length_spread"] == 0.0


def test_an_unknown_preset_is_named() -> None:
    result = runner.invoke(app, ["bench", "sim", "--preset", "nope", "--describe"])
    assert result.exit_code != 0
    assert "preset" in result.stderr
    assert "llmd-b2b-saas" in result.stderr
    assert "Traceback" not in result.output


def test_listing_the_bench_commands_imports_no_measurement_tool() -> None:
    """``firstlight bench --help`` names every tool from its one-line help; a tool's
    module (and what it imports) loads only when that tool runs."""
    from firstlight_bench.registry import TOOLS

    script = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from firstlight.cli import app\n"
        "result = CliRunner().invoke(app, ['bench', '--help'], env={'COLUMNS': '240'})\n"
        "assert result.exit_code == 0, result.output\n"
        "print(result.output)\n"
        "print('LOADED', json.dumps([m for m in sys.modules if m.startswith('firstlight_bench.')]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    help_text, loaded = done.stdout.rsplit("LOADED", 1)
    for name in TOOLS:
        assert f" {name} " in help_text, name
    tools = {f"firstlight_bench.tools.{name.replace('-', '_')}" for name in TOOLS}
    assert not tools & set(json.loads(loaded)), loaded
