"""The autoscaling benchmark's arithmetic and report (``firstlight bench autoscale``):
answers are counted in the phase they started in, failures are never hidden, and the
stored report renders into the page."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstlight_bench.clients.closed_loop import Answer
from firstlight_bench.reports.results import Outcome
from firstlight_bench.tools.autoscale import markers, render, summarize
from tests.bench.bench_cli import run_bench

AUTOSCALE_BEGIN, AUTOSCALE_END = markers(simulated=True)

BOUNDS = {"before": (0.0, 10.0), "step": (10.0, 30.0), "after": (30.0, 50.0)}


def _answer(
    started: float, ttft: float | None, problem: str | None = None, *, stream: bool = True
) -> Answer:
    first = None if ttft is None else started + ttft
    outcome = Outcome("r", started, first, started + (ttft or 0) + 0.1, error=problem)
    return Answer(outcome, stream, "local", "scale")


def test_answers_count_in_the_phase_they_started_in() -> None:
    answers = [
        _answer(1.0, 0.1),
        _answer(9.9, 0.3),
        _answer(10.0, 0.5),
        _answer(12.0, None, "HTTP 503"),
        _answer(29.0, 0.7),
        _answer(31.0, 0.2),
    ]
    before, step, after = summarize(answers, BOUNDS)
    assert (before.requests, before.failed) == (2, 0)
    assert before.ttft_p50_ms == pytest.approx(200.0)
    assert (step.requests, step.failed) == (3, 1)
    assert step.ttft_p50_ms == pytest.approx(600.0)  # the failed one has no TTFT
    assert after.requests == 1
    assert after.ttft_p95_ms == pytest.approx(200.0)


def test_ttft_is_the_streamed_answers_only() -> None:
    json_answer = _answer(1.0, 5.0, stream=False)
    (before, _, _) = summarize([_answer(2.0, 0.1), json_answer], BOUNDS)
    assert before.requests == 2
    assert before.ttft_p95_ms == pytest.approx(100.0)


def test_a_phase_without_answers_has_no_percentiles() -> None:
    _, _, after = summarize([_answer(1.0, 0.1)], BOUNDS)
    assert (after.requests, after.ttft_p50_ms, after.ttft_p95_ms) == (0, None, None)


def _report(failed: int = 0) -> dict[str, object]:
    phases = [
        {"phase": p, "requests": 10, "failed": failed if p == "step" else 0,
         "ttft_p50_ms": 100.0, "ttft_p95_ms": None if p == "after" else 300.0}
        for p in ("before", "step", "after")
    ]  # fmt: skip
    return {
        "command": "firstlight bench autoscale",
        "git_commit": "0123456789abcdef",
        "simulated": True,
        "step_clients": 6,
        "target_ongoing": 2.0,
        "phases": phases,
        "requests": 30,
        "failed": failed,
        "scaled_up_after_s": 12.4,
        "scaled_down_after_s": None,
    }


def test_the_report_renders_its_phases_and_says_what_was_simulated() -> None:
    text = render(_report(failed=2))
    assert text.startswith(AUTOSCALE_BEGIN)
    assert text.endswith(AUTOSCALE_END)
    assert "simulated replicas" in text
    assert "| step | 1 → 2 | 10 | 2 | 100 ms | 300 ms |" in text
    assert "| after | 2 → 1 | 10 | 0 | 100 ms | — |" in text
    assert "ran 12 s after the step began and was gone never after it ended" in text
    assert "2 of 30 requests failed" in text


def test_tables_only_rewrites_the_section_from_the_stored_report(tmp_path: Path) -> None:
    import json

    (tmp_path / "results.json").write_text(json.dumps(_report()))
    page = tmp_path / "page.md"
    page.write_text(f"# P\n\n{AUTOSCALE_BEGIN}\nold\n{AUTOSCALE_END}\n\nafter\n")
    result = run_bench("autoscale", "--tables-only", "--out", str(tmp_path), "--page", str(page))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # nothing measured: a run prints its report and tables
    assert page.read_text() == f"# P\n\n{render(_report())}\n\nafter\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tables-only", "--out", "x"], "--tables-only needs --out (the stored report) and"),
        (["--step-clients", "0"], "'--step-clients'"),
        (["--target-ongoing", "0"], "--target-ongoing: 0.0: above 0"),
        (["--engine", "tpu"], "'--engine'"),
        (["--before-s", "-1"], "'--before-s'"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("autoscale", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


@pytest.mark.parametrize(("folder", "simulated"), [("autoscale", True)])
def test_the_serving_page_shows_the_stored_run_and_no_request_failed(
    folder: str, simulated: bool
) -> None:
    import json

    repo = Path(__file__).resolve().parents[2]
    stored = json.loads((repo / f"docs/benchmarks/{folder}/results.json").read_text())
    assert stored["simulated"] is simulated
    assert render(stored) in (repo / "docs/serving.md").read_text(), (
        "docs/serving.md is stale: firstlight bench autoscale --tables-only "
        f"--out docs/benchmarks/{folder} --page docs/serving.md"
    )
    # The demonstration: 1 -> 2 -> 1 replicas with no failed request.
    assert stored["failed"] == 0
    assert stored["scaled_up_after_s"] is not None
    assert stored["scaled_down_after_s"] is not None
