"""The benchmarks page's generated tables: held to the stored run folders, and the suite
that writes both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstlight_bench.reports.live_tables import live_table, live_vs_sim_table, render_live_sections
from firstlight_bench.reports.results import short_commit
from firstlight_bench.reports.sections import BEGIN, END, replace_tables
from firstlight_bench.suite import render_tables, run_suite
from tests.bench.pages import shown_section

REPO = Path(__file__).parents[2]
PAGE = REPO / "docs" / "benchmarks.md"
STORED = REPO / "docs" / "benchmarks" / "suite"


def test_the_page_shows_exactly_the_stored_suite_runs() -> None:
    page = PAGE.read_text()
    assert shown_section(page, BEGIN, END) == render_tables(STORED), (
        "docs/benchmarks.md is stale: run `firstlight bench suite --tables-only`"
    )


def test_a_small_suite_writes_its_folders_and_their_tables(tmp_path: Path) -> None:
    lines: list[str] = []
    folders = run_suite(
        out=tmp_path, only=["w3", "w7"], requests=40, seeds=(0, 1), loads=(0.5,), jobs=1,
        progress=lines.append,
    )  # fmt: skip
    assert folders == [tmp_path / "w3"]  # w7 needs the trace: skipped, and said so
    assert any("w7: skipped" in line for line in lines)
    data = json.loads((tmp_path / "w3" / "results.json").read_text())
    assert {p["seed"] for p in data["points"]} == {0, 1}
    tables = render_tables(tmp_path)
    assert tables.startswith(BEGIN)
    assert tables.endswith(END)
    assert "### w3: W3, 40 requests, seeds 0, 1" in tables
    assert "| dynamo_kv |" in tables
    assert "| p90 vs best other | **" in tables
    assert "](benchmarks/suite/w3/ttft_vs_load.png)" in tables  # its picture, as the page links it
    assert "](runs/w3/ttft_vs_load.png)" in render_tables(tmp_path, "runs")
    page = replace_tables(f"intro\n{BEGIN}\nold\n{END}\noutro\n", tables)
    assert page == f"intro\n{tables}\noutro\n"


def test_a_page_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        replace_tables("no markers here", render_tables(Path("/nonexistent")))


def test_an_unknown_entry_is_named() -> None:
    from firstlight.errors import ConfigError

    with pytest.raises(ConfigError, match="w9"):
        run_suite(out=Path("/nonexistent"), only=["w9"])


def test_the_page_shows_exactly_the_stored_live_runs() -> None:
    page = PAGE.read_text()
    assert "<!-- live:live-sim-w1:begin" in page
    assert render_live_sections(page, STORED.parent) == page, (
        "docs/benchmarks.md is stale: run `firstlight bench suite --tables-only`"
    )


def test_a_live_section_is_the_stored_run_with_its_commit(tmp_path: Path) -> None:
    stored = json.loads((STORED.parent / "live-sim-w1" / "results.json").read_text())
    stored["meta"]["git_commit"] = "0123456789abcdef0123-dirty"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps(stored))
    page = "a\n<!-- live:run:begin -->\nold\n<!-- live:run:end -->\nb\n"
    out = render_live_sections(page, tmp_path)
    assert out == "a\n" + live_table("run", stored) + "\nb\n"
    assert "old" not in out
    assert "`0123456789ab + uncommitted changes`" in out
    for point in stored["points"]:
        assert f"| {point['arm']} | {point['ttft_ms']['p50']:.0f} / " in out
    with pytest.raises(FileNotFoundError):
        render_live_sections("<!-- live:gone:begin --><!-- live:gone:end -->", tmp_path)


def _run_of(peaks: dict[tuple[str, int], tuple[float, float]], ape: float) -> dict[str, object]:
    points = [
        {
            "arm": arm,
            "seed": seed,
            "day": {"peak": {"ttft_ms": {"p90": p90, "p99": p99}}},
            "prediction_ape": {"p50": ape},
        }
        for (arm, seed), (p90, p99) in peaks.items()
    ]
    return {"meta": {"seed": 0, "git_commit": "0123456789abcdef"}, "points": points}


def test_live_beside_simulated_compares_the_peak_ratios_per_seed(tmp_path: Path) -> None:
    live = _run_of(
        {
            ("firstlight", 0): (300.0, 600.0),
            ("firstlight_local", 0): (600.0, 1000.0),
            ("firstlight", 1): (400.0, 800.0),
            ("firstlight_local", 1): (400.0, 800.0),
            ("firstlight", 2): (1.0, 1.0),
            ("firstlight_local", 2): (1.0, 1.0),  # not simulated at seed 2: no row
        },
        0.08,
    )
    sim = _run_of(
        {
            ("firstlight", 0): (330.0, 300.0),
            ("firstlight_local", 0): (600.0, 1000.0),
            ("firstlight", 1): (400.0, 800.0),
            ("firstlight_local", 1): (400.0, 800.0),
            ("firstlight", 2): (1.0, 1.0),  # only simulated: no row
        },
        0.05,
    )
    table = live_vs_sim_table("day", live, sim).replace("\N{MULTIPLICATION SIGN}", "x")
    # Seed 0: p90 ratio 0.50 live vs 0.55 simulated (-9 %, agrees); p99 0.60 vs 0.30 (+100 %).
    assert (
        "| 0 | firstlight_local | x0.50 | x0.55 | yes (-9 %) | x0.60 | x0.30 | no (+100 %) |"
        in table
    )
    assert "| 1 | firstlight_local | x1.00 | x1.00 | yes (+0 %) |" in table
    assert "| 2 | firstlight_local |" not in table  # simulated without the other arm
    assert "| firstlight | 2 | 8.0 | 5.0 |" in table
    assert "| firstlight_local | 1 | 8.0 | 5.0 |" in table
    for name, data in (("day", live), ("day-prediction", sim)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(data))
    page = "a\n<!-- live-vs-sim:day:begin -->\nold\n<!-- live-vs-sim:day:end -->\nb\n"
    rendered = render_live_sections(page, tmp_path)
    assert rendered == f"a\n{live_vs_sim_table('day', live, sim)}\nb\n"


def test_a_clean_commit_is_shown_as_it_is() -> None:
    assert short_commit("0123456789abcdef") == "0123456789ab"


def test_a_stress_entry_runs_at_its_own_loads(tmp_path: Path) -> None:
    run_suite(out=tmp_path, only=["w1-overload"], requests=40, seeds=(0,), jobs=1)
    data = json.loads((tmp_path / "w1-overload" / "results.json").read_text())
    assert sorted({p["load"] for p in data["points"]}) == [2.0, 4.0, 6.0, 8.0]


def test_a_gateways_study_runs_its_routers_and_stays_out_of_the_goals(tmp_path: Path) -> None:
    run_suite(out=tmp_path, only=["w2-gateways2-unshared"], requests=40, seeds=(0,), jobs=1)
    data = json.loads((tmp_path / "w2-gateways2-unshared" / "results.json").read_text())
    assert (data["meta"]["config"]["gateways"], data["meta"]["config"]["route_share_ms"]) == (
        2,
        None,
    )
    page = render_tables(tmp_path)
    assert "2 gateways per region, routes not shared" in page
    # The only stored run is a study: the goals table counts nothing and says what is missing.
    goals = page.split("### The goals", 1)[1].split("###", 1)[0]
    assert "Not stored yet, so not counted: w1," in goals
    assert "w2-gateways2-unshared" not in goals
