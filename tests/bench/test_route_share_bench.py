"""The route-share benchmark over the real Redis (6379): every route reaches the other
router, and docs/serving.md shows exactly the stored report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstlight_bench.tools.route_share import SHARE_BEGIN, SHARE_END, render_share
from tests.bench.bench_cli import run_bench

REPO = Path(__file__).parents[2]
STORED = REPO / "docs" / "benchmarks" / "route-share" / "results.json"


def test_a_run_delivers_every_route_and_rewrites_its_section(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"before\n{SHARE_BEGIN}\nold\n{SHARE_END}\nafter\n")
    out = tmp_path / "results.json"
    argv = ["--requests", "30", "--rate", "1000", "--out", str(out), "--page", str(page)]
    result = run_bench("route-share", *argv)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert json.loads(result.stdout) == report
    # Each request is announced three times (routed, first token, done), and all arrive.
    assert report["events"] == {"published": 90, "applied": 90, "dropped": 0}
    delivery = report["delivery_ms"]
    assert 0 < delivery["p50"] <= delivery["p90"] <= delivery["p99"] <= delivery["max"]
    assert report["meta"]["command"] == (
        f"firstlight bench route-share --requests 30 --rate 1000 --out {out} --page {page}"
    )
    text = page.read_text()
    assert text == f"before\n{render_share(report)}\nafter\n"
    assert f"{delivery['p50']:.2f} ms" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "'--requests'"),
        (["--rate", "-1"], "--rate: -1: routes per second above 0"),
        (["--rate", "0"], "--rate: 0: routes per second above 0"),
        (["--rate", "100001"], "'--rate'"),
        (["--page", "x.md"], "--page needs --out"),
    ],
)
def test_bad_options_are_refused(argv: list[str], message: str) -> None:
    result = run_bench("route-share", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


def test_the_serving_page_shows_exactly_the_stored_report() -> None:
    page = (REPO / "docs" / "serving.md").read_text()
    shown = page[page.index(SHARE_BEGIN) : page.index(SHARE_END) + len(SHARE_END)]
    report = json.loads(STORED.read_text())
    assert shown == render_share(report), "docs/serving.md is stale: rerun the command it names"
    assert not report["meta"]["git_commit"].endswith("-dirty")
