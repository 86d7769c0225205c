"""The cache-index fault benchmark: after each fault the router stops crediting the
replica with the prefix it held, on the real path (the real Redis, a real ZMQ socket in
vLLM's wire format, the vLLM adapter, the ModelServer's hint bridge, a gateway's
subscriber and mirror, the routing policy); and its report and the reliability page's
table. No timing is asserted: the machine is shared."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from firstlight.config import HintsConfig
from firstlight.hints import redis_client
from firstlight_bench.reports.results import read_report
from firstlight_bench.tools.index_faults import (
    FAULTS,
    INDEX_BEGIN,
    INDEX_END,
    FaultName,
    render,
    render_report,
    summarize,
)
from firstlight_bench.tools.index_faults_run import measure
from tests.bench.bench_cli import run_bench
from tests.bench.pages import shown_section

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reliability.md"
STORED = REPO / "docs" / "benchmarks" / "index-faults"
COMMAND = (
    "firstlight bench index-faults --out docs/benchmarks/index-faults --page docs/reliability.md"
)


async def _keys(prefix: str) -> list[bytes]:
    client = redis_client(HintsConfig())
    try:
        return [key async for key in client.scan_iter(match=f"{prefix}*")]
    finally:
        await client.aclose()


async def test_after_every_fault_the_stale_replica_is_no_longer_credited() -> None:
    prefix = f"fltest:{uuid4().hex}:"
    measured = await measure(list(FAULTS), 3, blocks=4, timeout_s=10.0, key_prefix=prefix)
    samples = measured["samples"]
    assert [(s["fault"], s["trial"]) for s in samples] == [
        (fault, trial) for fault in FAULTS for trial in range(3)
    ]
    for sample in samples:
        assert sample["won_before"], f"the stale prefix never drew the request: {sample}"
        assert sample["healed"], f"still credited after 10 s: {sample}"
        assert sample["heal_ms"] >= 0
        assert sample["credited_after"] == 0, sample
        assert sample["mirror_after"] == 0, f"the mirror still holds the prefix: {sample}"
    rows = summarize(samples)
    assert [(row["fault"], row["trials"], row["healed"]) for row in rows] == [
        (fault, 3, 3) for fault in FAULTS
    ]
    assert await _keys(prefix) == [], "the run left keys in Redis"


def _sample(fault: str, trial: int, heal_ms: float | None) -> dict[str, Any]:
    return {
        "fault": fault,
        "trial": trial,
        "healed": heal_ms is not None,
        "heal_ms": heal_ms,
        "won_before": True,
        "credited_after": 0 if heal_ms is not None else 4,
        "mirror_after": 0 if heal_ms is not None else 4,
        "polls": 10,
    }


def test_the_summary_holds_each_fault_to_the_goal() -> None:
    samples = [_sample("cache-reset", i, ms) for i, ms in enumerate((10.0, 30.0, 90.0))]
    samples += [_sample("sequence-gap", 0, 2500.0), _sample("engine-restart", 0, None)]
    rows = {row["fault"]: row for row in summarize(samples)}
    assert list(rows) == ["cache-reset", "sequence-gap", "engine-restart"]
    reset = rows["cache-reset"]
    assert (reset["healed"], reset["p50_ms"], reset["max_ms"]) == (3, 30.0, 90.0)
    assert reset["p99_ms"] == pytest.approx(88.8)
    assert reset["meets_goal"]
    assert not rows["sequence-gap"]["meets_goal"]  # healed, but after 2.5 s
    restart = rows["engine-restart"]
    assert (restart["healed"], restart["max_ms"], restart["meets_goal"]) == (0, None, False)


def test_the_faults_option_names_every_fault() -> None:
    assert [f.value for f in FaultName] == list(FAULTS)


def test_a_small_run_stores_its_report_and_rewrites_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# Reliability\n\n{INDEX_BEGIN}\nold\n{INDEX_END}\n\nafter\n")
    out = tmp_path / "run"
    argv = ["--trials", "2", "--faults", "cache-reset", "--faults", "replica-removal"]
    argv += ["--prefix-blocks", "2"]
    result = run_bench("index-faults", *argv, "--out", str(out), "--page", str(page))
    assert result.exit_code == 0, result.output
    stored = read_report(out)
    assert stored["command"] == "firstlight bench index-faults " + shlex.join(
        [*argv, "--out", str(out), "--page", str(page)]
    )
    # Printed: the JSON report as stored, then the page's section.
    assert result.stdout == (out / "results.json").read_text() + render(stored) + "\n"
    assert [row["fault"] for row in stored["summary"]] == ["cache-reset", "replica-removal"]
    assert len(stored["samples"]) == 4
    section = render(stored)
    assert section.startswith(INDEX_BEGIN)
    assert section.endswith(INDEX_END)
    assert "| cache-reset | the engine publishes `AllBlocksCleared` | 2/2 |" in section
    assert "* replica-removal: Ray's controller noticing the replica go" in section
    assert page.read_text() == f"# Reliability\n\n{section}\n\nafter\n"
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# Cache-index faults")
    assert markdown == render_report(stored)
    assert INDEX_BEGIN not in markdown
    # --tables-only re-renders the page from the stored report alone.
    page.write_text(f"{INDEX_BEGIN}\nstale\n{INDEX_END}\n")
    result = run_bench("index-faults", "--tables-only", "--out", str(out), "--page", str(page))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # nothing measured, nothing printed
    assert page.read_text() == f"{section}\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trials", "0"], "'--trials'"),
        (["--prefix-blocks", "0"], "'--prefix-blocks'"),
        (["--timeout-s", "0"], "--timeout-s: 0: must be more than 0"),
        (["--faults", "power-cut"], "'--faults'"),
        (["--tables-only", "--page", "x.md"], "--tables-only needs --out"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("index-faults", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


def test_the_reliability_page_shows_the_stored_run() -> None:
    text = PAGE.read_text()
    section = shown_section(text, INDEX_BEGIN, INDEX_END)
    if not (STORED / "results.json").is_file():
        pytest.skip(f"no stored run in {STORED} yet: {COMMAND}")
    assert section == render(read_report(STORED)), (
        f"docs/reliability.md is stale: {COMMAND} --tables-only"
    )
