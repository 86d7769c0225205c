"""The RAG benchmark's workload and report (``firstlight_bench.tools.rag``,
``firstlight_bench.tools.rag_workload``), and the stored run the docs show."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from firstlight_bench.reports.results import Outcome
from firstlight_bench.tools.rag import RAG_BEGIN, RAG_END, Asked, render, summarize
from firstlight_bench.tools.rag_workload import rag_cases
from tests.bench.bench_cli import run_bench

REPO = Path(__file__).resolve().parents[2]
Verdict = tuple[tuple[int, ...], int, bool]
"""The documents kept, the relevant one, whether the answer was right."""


def test_the_workload_is_seeded_and_each_answer_is_in_its_document_only() -> None:
    cases = rag_cases(seed=3, questions=30)
    assert cases == rag_cases(seed=3, questions=30)
    assert cases != rag_cases(seed=4, questions=30)
    for case in cases:
        assert len(case.documents) == 5
        assert case.answer in case.documents[case.relevant]
        name = case.question.split(" the ")[1].split()[0]
        assert [name in d for d in case.documents].count(True) == 1
        assert name in case.documents[case.relevant]


def _asked(arm: str, question: int, prompt_tokens: int, ttft_ms: float, verdict: Verdict) -> Asked:
    """A question sent at 0 s whose answer's first text came ``ttft_ms`` later, its last
    half a second after that."""
    first = ttft_ms / 1000
    outcome = Outcome(f"{arm}-{question}", 0.0, first, first + 0.5, prompt_tokens, 8)
    kept, relevant, correct = verdict
    return Asked(arm, question, outcome, kept, relevant, correct)


def test_a_question_is_stored_with_the_keys_of_the_stored_run() -> None:
    row = _asked("budget", 4, 700, 300.0, ((2,), 2, True)).row()
    stored = json.loads((REPO / "docs/benchmarks/rag-vllm-cpu/results.json").read_text())
    assert list(row) == list(stored["asked"][0])
    assert row == {
        "arm": "budget",
        "question": 4,
        "prompt_tokens": 700,
        "ttft_ms": 300.0,
        "kept": (2,),
        "relevant": 2,
        "correct": True,
    }


def test_the_summary_and_the_table() -> None:
    asked = [
        _asked("all", 0, 3000, 1000.0, ((0, 1, 2, 3, 4), 2, True)),
        _asked("budget", 0, 700, 300.0, ((2,), 2, True)),
        _asked("all", 1, 3200, 1200.0, ((0, 1, 2, 3, 4), 0, False)),
        _asked("budget", 1, 650, 200.0, ((3,), 0, False)),
    ]
    [full, cut] = summarize(asked)
    assert (full.prompt_tokens_p50, cut.prompt_tokens_p50) == (3100.0, 675.0)
    assert (full.ttft_p50_ms, cut.ttft_p50_ms) == (1100.0, 250.0)
    assert (full.right_document_share, cut.right_document_share) == (1.0, 0.5)
    assert cut.correct_answer_share == 0.5
    report = {
        "git_commit": "0" * 40,
        "command": "firstlight bench rag",
        "questions": 2,
        "documents": 5,
        "budget": 700,
        "arms": [asdict(full), asdict(cut)],
    }
    text = render(report)
    assert "prompt tokens p50 fell by 78% and TTFT p50 by 77%" in text
    assert "| context budget | 2 | 675 | 250 ms | 290 ms | 50% | 50% |" in text


def test_the_context_page_shows_the_stored_run_and_the_goals() -> None:
    stored = json.loads((REPO / "docs/benchmarks/rag-vllm-cpu/results.json").read_text())
    assert render(stored) in (REPO / "docs/context.md").read_text(), (
        "docs/context.md is stale: firstlight bench rag --tables-only "
        "--out docs/benchmarks/rag-vllm-cpu --page docs/context.md"
    )
    arms = {a["arm"]: a for a in stored["arms"]}
    assert arms["budget"]["right_document_share"] >= 0.95
    assert stored["questions"] >= 40


def test_tables_only_rewrites_the_page_from_the_stored_run(tmp_path: Path) -> None:
    page = tmp_path / "context.md"
    page.write_text(f"before\n{RAG_BEGIN}\nold\n{RAG_END}\nafter\n")
    stored = REPO / "docs/benchmarks/rag-vllm-cpu"
    result = run_bench("rag", "--tables-only", "--out", str(stored), "--page", str(page))
    assert result.exit_code == 0, result.output
    report = json.loads((stored / "results.json").read_text())
    assert page.read_text() == f"before\n{render(report)}\nafter\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--questions", "1"], "'--questions'"),
        (["--budget", "0"], "'--budget'"),
        (["--max-tokens", "0"], "'--max-tokens'"),
        (["--seed", "-1"], "'--seed'"),
        (
            ["--tables-only", "--out", "x"],
            "--tables-only needs --out (the stored report) and --page",
        ),
    ],
)
def test_bad_options_are_refused_before_anything_starts(argv: list[str], message: str) -> None:
    result = run_bench("rag", *argv)
    assert result.exit_code == 2
    assert message in result.stderr
