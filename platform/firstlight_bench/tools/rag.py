"""Dynamic context loading measured: prompt tokens and time to first token of a RAG
workload with and without a context budget, on one local region with the real default
model, and whether the right document was kept.

Run ``firstlight bench rag`` (options ``--questions 40 --budget 700 --seed 0
--max-tokens 16 --cache-dir DIR --out FOLDER --page PAGE``, and ``--tables-only`` to
re-render the page from a stored report). The workload is
:func:`~firstlight_bench.tools.rag_workload.rag_cases`: each question comes with five documents
of some 620 tokens, one of which holds the answer. Each question is asked twice through
the official ``openai`` client, streamed, greedy: once sending every document
(``firstlight.documents``, no budget: all five are written into the prompt) and once with
``context_budget_tokens`` (the gateway ranks the documents and keeps what fits). The
order of the two alternates from question to question (A B, B A, ...), and the two arms
use different system prompts, so neither reuses the other's cached blocks.

Reported per arm: prompt tokens (the engine's usage) and client-side TTFT (p50, p90),
the share of questions whose kept documents include the one holding the answer (from
the ``x-firstlight-context`` header), and the share of answers that contain the expected
fact (this 135M model often answers wrong even with the right document; the measure is
reported, not a goal). The reductions compare the two arms' p50s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight._ports import free_port
from firstlight.config import DEFAULT_MODEL_NAME, PlatformConfig, parse_config
from firstlight.quantiles import quantile
from firstlight_bench.options import (
    OutOption,
    PageOption,
    SeedOption,
    TablesOnlyOption,
    rewrote_tables,
)
from firstlight_bench.reports.results import Outcome, run_header, short_commit
from firstlight_bench.reports.sections import replace_tables
from firstlight_bench.tools.engine import emit
from firstlight_bench.tools.rag_workload import RagCase, rag_cases

__all__ = ["ArmSummary", "app", "render", "summarize"]

RAG_BEGIN = (
    "<!-- rag:begin (generated from docs/benchmarks/rag-vllm-cpu/results.json; do not edit) -->"
)
RAG_END = "<!-- rag:end -->"
_REGION = "rag"
_SYSTEM = {
    "all": "Answer the question from the documents, in a few words.",
    "budget": "Using the documents, answer the question in a few words.",
}


@dataclass(frozen=True, slots=True)
class Asked:
    """One question asked in one arm: what its client saw, and the verdict: the documents
    the gateway kept, the one that holds the answer, whether the answer has it."""

    arm: str
    question: int
    outcome: Outcome
    kept: tuple[int, ...]
    relevant: int
    correct: bool

    def row(self) -> dict[str, Any]:
        """Its row of the stored report's ``asked`` (the keys stored reports have)."""
        seen = {"prompt_tokens": self.outcome.prompt_tokens, "ttft_ms": self.outcome.ttft_ms}
        verdict = {"kept": self.kept, "relevant": self.relevant, "correct": self.correct}
        return {"arm": self.arm, "question": self.question, **seen, **verdict}


@dataclass(frozen=True, slots=True)
class ArmSummary:
    """One arm's figures."""

    arm: str
    requests: int
    prompt_tokens_p50: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    right_document_share: float
    correct_answer_share: float


def summarize(asked: Sequence[Asked]) -> list[ArmSummary]:
    """Per arm (``all``, ``budget``): the medians and shares of the report."""
    out = []
    for arm in ("all", "budget"):
        mine = [a for a in asked if a.arm == arm]
        if not mine:
            continue
        ttfts = [ms for a in mine if (ms := a.outcome.ttft_ms) is not None]
        out.append(
            ArmSummary(
                arm,
                len(mine),
                _quantile([float(a.outcome.prompt_tokens) for a in mine], 0.5),
                _quantile(ttfts, 0.5),
                _quantile(ttfts, 0.9),
                sum(a.relevant in a.kept for a in mine) / len(mine),
                sum(a.correct for a in mine) / len(mine),
            )
        )
    return out


def _quantile(values: list[float], q: float) -> float:
    value = quantile(values, q)
    assert value is not None  # only called with values
    return value


def _config(port: int, cache_dir: Path | None) -> PlatformConfig:
    data: dict[str, Any] = {
        "mode": "local",
        "regions": [{"name": _REGION, "peers": []}],
        "models": [
            {
                "name": DEFAULT_MODEL_NAME,
                "dtype": "float32",
                "max_model_len": 4096,
                "kv_cache_gib": 1,
                "dynamic_context": {},
                "resources": {"num_cpus": 0},
            }
        ],
        "auth": {"enabled": False},
        "gateway": {"host": "127.0.0.1", "port": port},
        "hints": {"key_prefix": "firstlight:rag:"},
    }
    if cache_dir is not None:
        data["cache_dir"] = str(cache_dir)
    return parse_config(data, "firstlight bench rag")


def _ask(client: Any, case: RagCase, index: int, arm: str, budget: int, max_tokens: int) -> Asked:
    extension: dict[str, Any] = {"documents": list(case.documents)}
    if arm == "budget":
        extension["context_budget_tokens"] = budget
    started = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL_NAME,
        messages=[
            {"role": "system", "content": _SYSTEM[arm]},
            {"role": "user", "content": case.question},
        ],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"firstlight": extension},
    )
    header = raw.headers.get("x-firstlight-context", "")
    first: float | None = None
    text, prompt_tokens, output_tokens = [], 0, 0
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter()
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            prompt_tokens, output_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
    end = time.perf_counter()
    if first is None or not prompt_tokens or not header:
        raise RuntimeError(f"question {index} ({arm}): no text, usage or context header")
    kept = tuple(int(i) for i in header.rsplit(": ", 1)[1].split(","))
    answer = "".join(text)
    outcome = Outcome(f"{arm}-{index}", started, first, end, prompt_tokens, output_tokens)
    return Asked(arm, index, outcome, kept, case.relevant, case.answer.lower() in answer.lower())


def _measure(
    endpoint: str, *, seed: int, questions: int, budget: int, max_tokens: int
) -> list[Asked]:
    import openai

    cases = rag_cases(seed, questions + 2)
    asked = []
    with openai.OpenAI(base_url=f"{endpoint}/v1", api_key="local", max_retries=0) as client:
        for i, case in enumerate(cases[:2]):  # warm-up: each arm's system prompt cached
            for arm in ("all", "budget"):
                _ask(client, case, -1 - i, arm, budget, max_tokens)
        for i, case in enumerate(cases[2:]):
            arms = ("all", "budget") if i % 2 == 0 else ("budget", "all")
            for arm in arms:
                asked.append(_ask(client, case, i, arm, budget, max_tokens))
    return asked


def render(report: dict[str, Any]) -> str:
    """The docs' table of a stored report."""
    arms = {a["arm"]: a for a in report["arms"]}
    full, cut = arms["all"], arms["budget"]
    lines = [
        RAG_BEGIN,
        "",
        f"Measured at {short_commit(report['git_commit'])} (`{report['command']}`): one local "
        f"region, the default model on vLLM-CPU, {report['questions']} questions with "
        f"{report['documents']} documents each, budget {report['budget']} tokens.",
        "",
        "| arm | requests | prompt tokens p50 | TTFT p50 | TTFT p90 | right document kept "
        "| answer contains the fact |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"all": "every document", "budget": "context budget"}
    for a in (full, cut):
        lines.append(
            f"| {names[a['arm']]} | {a['requests']} | {a['prompt_tokens_p50']:.0f} "
            f"| {a['ttft_p50_ms']:.0f} ms | {a['ttft_p90_ms']:.0f} ms "
            f"| {a['right_document_share']:.0%} | {a['correct_answer_share']:.0%} |"
        )
    tokens = 1 - cut["prompt_tokens_p50"] / full["prompt_tokens_p50"]
    ttft = 1 - cut["ttft_p50_ms"] / full["ttft_p50_ms"]
    lines += [
        "",
        f"With the budget, prompt tokens p50 fell by {tokens:.0%} and TTFT p50 by {ttft:.0%}; "
        f"the right document was kept for {cut['right_document_share']:.0%} of the questions.",
        "",
        RAG_END,
    ]
    return "\n".join(lines)


app = typer.Typer(add_completion=False)


@app.command()
def rag(
    questions: Annotated[int, typer.Option(min=2, help="Questions asked in each arm.")] = 40,
    budget: Annotated[
        int, typer.Option(min=1, help="The budget arm's context budget, tokens.")
    ] = 700,
    seed: SeedOption = 0,
    max_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per answer at most.")] = 16,
    cache_dir: Annotated[Path | None, typer.Option(help="Folder of prepared models.")] = None,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: TablesOnlyOption = False,
) -> None:
    """Dynamic context loading measured on one local region with the default model: each
    question with every document and with a context budget; prints the JSON report and
    the page's table, stores it with --out, rewrites --page's table. Run by a maintainer
    to refresh docs/context.md."""
    if rewrote_tables(out, page, tables_only, _rewrite):
        return
    import ray

    from firstlight.serve.local_mode import start_local, stop_local

    running = start_local(_config(free_port(), cache_dir), timeout_s=600)
    try:
        asked = _measure(
            running.endpoints[_REGION],
            seed=seed,
            questions=questions,
            budget=budget,
            max_tokens=max_tokens,
        )
    finally:
        stop_local(running)
        ray.shutdown()
    report = {
        **run_header(),
        "simulated": False,
        "questions": questions,
        "documents": 5,
        "budget": budget,
        "arms": [asdict(s) for s in summarize(asked)],
        "asked": [a.row() for a in asked],
    }
    emit(report, out / "results.json" if out else None)
    typer.echo(render(report))
    if page is not None:
        _rewrite(page, report)


def _rewrite(page: Path, report: dict[str, Any]) -> None:
    page.write_text(replace_tables(page.read_text(), render(report), begin=RAG_BEGIN, end=RAG_END))
