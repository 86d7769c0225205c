"""The runs published in docs/benchmarks/ are what docs/benchmarks.md says they are: each
folder's results.json validates, simulated runs say so, and every link resolves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from firstlight_bench.reports.results import validate_results

DOCS = Path(__file__).resolve().parents[2] / "docs"
BENCHMARKS = DOCS / "benchmarks"
RUNS = sorted(
    p.parent
    for pattern in ("*/results.json", "suite/*/results.json")
    for p in BENCHMARKS.glob(pattern)
    # Micro-benchmarks' reports, not run folders (their own tests hold their pages).
    if p.parent.name
    not in (
        "decision",
        "route-share",
        "offload-sim",
        "index-faults",
        "faults",
        "data-path",
        "telemetry",
        "mutation",
        "test-suite",
    )
    and not p.parent.name.startswith(
        (
            "serving-",
            "peers-",
            "engine-",
            "features-",
            "autoscale",
            "rag-",
            "advisor",
            "outliers",
            "soak",
            "quantization",
        )
    )
)


def _name(run: Path) -> str:
    return str(run.relative_to(BENCHMARKS))


def test_the_published_runs_are_there() -> None:
    names = {_name(run) for run in RUNS}
    assert "suite/w8" in names
    assert {"live-sim-w1", "live-vllm-w1"} <= names


@pytest.mark.parametrize("run", RUNS, ids=[_name(r) for r in RUNS])
def test_each_published_run_validates_and_is_labelled(run: Path) -> None:
    data = json.loads((run / "results.json").read_text())
    validate_results(data)
    if _name(run).startswith("suite/") or run.name == "live-sim-w1":
        assert data["meta"]["simulated"] is True
    if run.name == "live-vllm-w1":
        assert data["meta"]["simulated"] is False  # real vLLM engines
    assert (run / "report.md").is_file()


def test_every_relative_link_in_the_benchmarks_page_resolves() -> None:
    page = (DOCS / "benchmarks.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", page)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local, "the page links its runs"
    missing = [link for link in local if not (DOCS / link).exists()]
    assert missing == []
