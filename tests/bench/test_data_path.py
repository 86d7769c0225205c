"""The data-path spike's page section: docs/architecture.md shows exactly the stored run,
from a clean commit, with every path measured."""

from __future__ import annotations

import json
import re

from firstlight_bench.data_path import PATHS, markers, render_markdown
from tests.bench.pages import shown_section
from tests.bench.test_serving_bench import REPO


def test_the_architecture_page_shows_exactly_the_stored_data_path_run() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    assert re.findall(r"<!-- data-path:([\w-]+):begin", page) == ["data-path"]
    report = json.loads((REPO / "docs" / "benchmarks" / "data-path" / "results.json").read_text())
    begin, end = markers("data-path")
    assert shown_section(page, begin, end) == render_markdown(report, "data-path")
    assert not report["meta"]["git_commit"].endswith("-dirty")
    assert set(report["paths"]) == set(PATHS) == set(report["requests_per_s"])
    assert "--out docs/benchmarks/data-path" in report["meta"]["command"]  # no local path
