"""write_run writes a valid results.json, a readable report.md and real PNG plots."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from firstlight_bench.reports.report import replot, write_run
from firstlight_bench.reports.results import Outcome, summarize, validate_results

PLOT_KEYS = ("ttft_vs_load", "hit_rate_vs_load", "goodput_vs_load")

ARMS = ("round_robin", "firstlight", "cache_aware")  # deliberately not sorted
LOADS = (0.2, 0.6, 1.0)
# TTFT grows with load, fastest for firstlight; round_robin misses 500 ms p99 at 0.6.
TTFT_BASE_MS = {"firstlight": 50.0, "cache_aware": 80.0, "round_robin": 150.0}
HIT_RATE = {"firstlight": 0.6, "cache_aware": 0.5, "round_robin": 0.1}
COMMAND = "firstlight bench sim --workload w1 --seed 7 --out results/w1"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _outcomes(arm: str, load: float) -> list[Outcome]:
    outcomes = []
    for i in range(40):
        arrival = i * 0.25
        ttft_s = TTFT_BASE_MS[arm] * (1 + 4 * load**2) * (1 + i / 40) / 1000
        prompt = 400
        outcomes.append(
            Outcome(
                request_id=f"{arm}-{load}-{i}",
                arrival_s=arrival,
                first_token_s=arrival + ttft_s,
                finish_s=arrival + ttft_s + 0.02 * 31,
                prompt_tokens=prompt,
                output_tokens=32,
                cached_tokens=int(prompt * HIT_RATE[arm]),
                client_region=i % 3,
                served_region=(i + (i % 5 == 0)) % 3,
                replica=f"r{i % 4}",
                decision_us=30.0 + i,
            )
        )
    return outcomes


def _points() -> list[dict[str, Any]]:
    return [
        summarize(arm, load, _outcomes(arm, load), imbalance=1.1 + load)
        for arm in ARMS
        for load in LOADS
    ]


def _meta(*, simulated: bool = True) -> dict[str, Any]:
    return {
        "seed": 7,
        "git_commit": "0123abcd-dirty",
        "config": {"replicas": 12, "regions": ["us", "eu", "ap"], "block_tokens": 16},
        "workload": {"name": "W1 shared prefix", "groups": 8},
        "simulated": simulated,
        "created_at": "2025-01-01T00:00:00+00:00",
        "command": COMMAND,
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_run(tmp_path_factory.mktemp("run") / "w1", _meta(), _points())


def test_all_files_are_written(run: dict[str, Path]) -> None:
    assert set(run) == {
        "results",
        "report",
        "ttft_vs_load",
        "hit_rate_vs_load",
        "goodput_vs_load",
    }
    assert all(path.is_file() for path in run.values())
    assert {path.parent for path in run.values()} == {run["results"].parent}


def test_results_round_trip_sorted_and_valid(run: dict[str, Path]) -> None:
    text = run["results"].read_text()
    assert text.startswith('{\n  "meta": {')  # indent 2
    data = json.loads(text)
    validate_results(data)
    assert data["meta"] == _meta()
    expected = sorted(_points(), key=lambda p: (p["arm"], p["load"]))
    assert data["points"] == json.loads(json.dumps(expected))
    assert [p["arm"] for p in data["points"][::3]] == ["cache_aware", "firstlight", "round_robin"]


def test_report_has_meta_tables_and_bold_best_values(run: dict[str, Path]) -> None:
    report = run["report"].read_text()
    assert report.startswith("# Firstlight benchmark: W1 shared prefix (simulated)\n")
    for text in ("`7`", "`0123abcd-dirty`", COMMAND, "block_tokens: 16", "groups: 8"):
        assert text in report
    for load in ("## Load 0.2", "## Load 0.6", "## Load 1"):
        assert load in report
    rows = [line for line in report.splitlines() if line.startswith("| firstlight |")]
    assert len(rows) == 4  # three loads + the capacity table
    first = rows[0].split(" | ")
    # TTFT p50 at load 0.2: 50 ms x 1.16 x (1 + 19.5/40) = 86.26 ms, the best of the arms.
    assert first[1] == "**86.3**"
    header = next(line for line in report.splitlines() if line.startswith("| arm |"))
    assert "TPOT p90 ms" in header  # points carry it; runs stored before do not show it
    assert first[header.split(" | ").index("hit rate %")] == "**60.0**"
    rr = next(line for line in report.splitlines() if line.startswith("| round_robin |"))
    assert "**" not in rr.split(" | ")[1]
    # Errors are 0 for every arm: a tie with no difference is not bolded.
    assert "**0**" not in report


def test_capacity_table_gives_the_highest_load_within_slo(run: dict[str, Path]) -> None:
    report = run["report"].read_text()
    assert "## Highest load with p99 TTFT within SLO (500 ms)" in report
    section = report.split("## Highest load with p99 TTFT within SLO")[1]
    # p99 TTFT at load 1.0: firstlight 50 x 5 x (1 + 38.61/40) = 491 ms (within); cache_aware 786.
    assert "| firstlight | **1** | 491 |" in section
    assert "| cache_aware | 0.6 |" in section
    assert "| round_robin | 0.2 |" in section


def test_report_links_the_plots(run: dict[str, Path]) -> None:
    report = run["report"].read_text()
    for name in ("ttft_vs_load.png", "hit_rate_vs_load.png", "goodput_vs_load.png"):
        assert f"]({name})" in report


@pytest.mark.parametrize("key", PLOT_KEYS)
def test_plots_are_real_pngs(run: dict[str, Path], key: str) -> None:
    data = run[key].read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (1200, 800)


def test_a_real_run_is_not_labelled_simulated(tmp_path: Path) -> None:
    points = [summarize(arm, 0.5, _outcomes(arm, 0.5), imbalance=1.0) for arm in ARMS]
    paths = write_run(tmp_path, _meta(simulated=False), points)
    report = paths["report"].read_text()
    assert "(simulated)" not in report
    assert "no (real platform)" in report


def test_invalid_data_is_refused_before_writing(tmp_path: Path) -> None:
    points = _points()
    del points[4]["errors"]
    with pytest.raises(ValueError, match=r"\$\.points\[\d\]: 'errors' is a required property"):
        write_run(tmp_path / "out", _meta(), points)
    assert not (tmp_path / "out").exists()


def test_a_run_without_completions_still_reports(tmp_path: Path) -> None:
    failed = [
        Outcome(f"r{i}", i * 0.1, None, None, 100, 0, 0, 0, None, None, "shed") for i in range(5)
    ]
    points = [summarize(arm, load, failed, imbalance=0.0) for arm in ARMS for load in LOADS]
    paths = write_run(tmp_path, _meta(), points)
    report = paths["report"].read_text()
    assert "| firstlight | none | n/a |" in report
    assert paths["ttft_vs_load"].read_bytes()[:8] == PNG_MAGIC


def test_replot_draws_the_stored_runs_plots_again(tmp_path: Path) -> None:
    """The pictures beside a page's tables are drawn from the stored results.json: a
    lost or stale plot comes back as the run drew it."""
    paths = write_run(tmp_path / "w1", _meta(), _points())
    drawn = {key: paths[key].read_bytes() for key in PLOT_KEYS}
    for key in PLOT_KEYS:
        paths[key].write_bytes(b"stale")
    replot(tmp_path / "w1")
    assert {key: paths[key].read_bytes() for key in PLOT_KEYS} == drawn
