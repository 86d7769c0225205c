"""The observability page's cost table is the stored telemetry benchmark
(``firstlight bench telemetry --out docs/benchmarks/telemetry --page docs/observability.md``)."""

from __future__ import annotations

import json
from pathlib import Path

from firstlight_bench.tools.telemetry import markers, render_markdown
from tests.bench.pages import shown_section

REPO = Path(__file__).parents[2]


def test_the_page_shows_the_stored_telemetry_cost() -> None:
    report = json.loads((REPO / "docs" / "benchmarks" / "telemetry" / "results.json").read_text())
    page = (REPO / "docs" / "observability.md").read_text()
    begin, end = markers("telemetry")
    assert shown_section(page, begin, end) == render_markdown(report, "telemetry")
