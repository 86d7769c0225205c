"""Outlier capture measured end to end: is a planted slow request captured with every
field, and does a steady run capture nothing?

Run ``firstlight bench outliers`` (options ``--engine sim|vllm --requests 1000
--concurrency 4 --seed 0 --cache-dir DIR --out FOLDER --page PAGE --tables-only``; ``--help``
says each). One local region serves the default model (two replicas, one gateway,
``telemetry.outlier_*`` at their defaults: factor 10, judged from the 50th request, a
window of 1,000), with traces on: the tool runs a minimal OTLP/HTTP receiver of its own
(``POST /v1/traces``) and points ``telemetry.otlp_endpoint`` at it, so the records carry
real trace ids, and checks that the planted request's trace id arrived there.

* steady: ``--requests`` chat requests of one shape (short prompts of similar size,
  ``max_tokens`` 16, greedy, streamed through the official ``openai`` client) at
  ``--concurrency`` in flight; then the gateway's captures are read from
  ``GET /dashboard/api/state`` (``outliers``) and ``GET /metrics``
  (``firstlight_outliers_total``). Every capture of this phase is a false capture: the
  goal is 0 in 1,000 requests.
* planted: once the steady requests are done, one request with a prompt far longer than
  the steady ones (a legitimate TTFT well over 10 times the median), then the captures
  again: the planted request must be among them, and the report lists which of the
  record's fields (the doc's table) are non-null. The dashboard omits ``request_id``: it
  is checked on the WARNING line of the ``firstlight.outliers`` logger in the gateway's
  Serve log (``not checked`` when that file cannot be read).

With ``--engine sim`` the replicas are simulated (the default model's CPU profile, in
real time; one token per byte) and the report says so. The run itself (its requests,
the region, the trace receiver, what is read back) is
:mod:`firstlight_bench.tools.outliers_run`'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight._ports import free_port
from firstlight.quantiles import quantile
from firstlight_bench import options
from firstlight_bench.reports.results import run_header, short_commit
from firstlight_bench.reports.sections import replace_tables
from firstlight_bench.tools.engine import emit
from firstlight_bench.tools.outliers_run import (
    MAX_TOKENS,
    PLANTED_CHARS,
    REGION,
    REPLICAS,
    Asked,
    measure,
    planted_messages,
    region_config,
    trace_receiver,
)

__all__ = [
    "FIELDS",
    "app",
    "markers",
    "render",
    "summarize",
]


FIELDS = (
    "kinds",
    "request_id",
    "trace_id",
    "route",
    "served_region",
    "peer_region",
    "replica",
    "explanation",
    "predicted_ttft_ms",
    "ttft_ms",
    "dispatch_ttft_ms",
    "median_ttft_ms",
    "e2e_ms",
    "median_e2e_ms",
    "predicted_queue_wait_ms",
    "replica_queue_len",
    "cached_tokens",
    "runner_up",
    "runner_up_ttft_ms",
    "input_tokens",
    "output_tokens",
)
"""The record's fields as docs/observability.md's "Outliers" table lists them."""
LOCAL_NULL = ("peer_region",)
"""Fields the doc specifies as ``null`` for a request served in its own region."""


def markers(simulated: bool) -> tuple[str, str]:
    """The page markers around a run's section: one pair per engine."""
    name, folder = ("outliers", "outliers-sim") if simulated else ("outliers-vllm", "outliers-vllm")
    return (
        f"<!-- {name}:begin (generated from docs/benchmarks/{folder}/results.json; "
        "do not edit) -->",
        f"<!-- {name}:end -->",
    )


def summarize(
    steady: Sequence[Asked],
    planted: Asked,
    after_steady: Sequence[dict[str, Any]],
    after_planted: Sequence[dict[str, Any]],
    *,
    counted_steady: dict[str, float],
    counted_planted: dict[str, float],
    log_records: Sequence[dict[str, Any]] | None,
    traced: set[str] | None,
) -> dict[str, Any]:
    """The report's findings (see the module docstring). ``after_steady`` and
    ``after_planted``: the dashboard's captures read after each phase; ``log_records``:
    the parsed WARNING lines (``None``: not readable); ``traced``: the trace ids the
    receiver got (``None``: traces not checked)."""
    answered = [a.outcome for a in steady if a.outcome.completed]
    ttfts = [ms for o in answered if (ms := o.ttft_ms) is not None]
    e2es = [ms for o in answered if (ms := o.e2e_ms) is not None]
    prompt_tokens = [o.prompt_tokens for o in answered]  # an answer has its usage
    # Every capture read after the steady phase came from a steady request.
    false_captures = list(after_steady)
    planted_at = planted.started_at
    new = [c for c in after_planted if c.get("at", 0.0) >= planted_at and c not in after_steady]
    record = new[0] if new else None
    log_line = None
    planted_id = planted.outcome.request_id
    if log_records is not None and planted_id:
        log_line = next((r for r in log_records if r.get("request_id") == planted_id), None)
    present: list[str] = []
    missing: list[str] = []
    by_design: list[str] = []
    unchecked: list[str] = []
    if record is not None:
        for name in FIELDS:
            if name == "request_id":  # the dashboard omits it: the log line has it
                if log_records is None:
                    unchecked.append(name)
                elif log_line is not None and log_line.get("request_id"):
                    present.append(name)
                else:
                    missing.append(name)
            elif record.get(name) not in (None, [], ""):
                present.append(name)
            elif name in LOCAL_NULL and record.get("route") == "local":
                by_design.append(name)
            else:
                missing.append(name)
    trace_id = None if record is None else record.get("trace_id")
    seen = planted.row()
    return {
        "steady": {
            "requests": len(steady),
            "failed": len(steady) - len(answered),
            "problems": sorted({e for a in steady if (e := a.outcome.error) is not None})[:5],
            "prompt_tokens_mean": statistics.fmean(prompt_tokens) if prompt_tokens else None,
            "ttft_p50_ms": quantile(ttfts, 0.5),
            "ttft_p99_ms": quantile(ttfts, 0.99),
            "ttft_max_ms": max(ttfts) if ttfts else None,
            "e2e_p50_ms": quantile(e2es, 0.5),
            "e2e_p99_ms": quantile(e2es, 0.99),
        },
        "false_captures": len(false_captures),
        "false_capture_records": false_captures,
        "counted_after_steady": counted_steady,
        "counted_after_planted": counted_planted,
        "planted": {
            "prompt_tokens": seen["prompt_tokens"],
            "client_ttft_ms": seen["ttft_ms"],
            "client_e2e_ms": seen["e2e_ms"],
            "problem": seen["problem"],
            "captured": record is not None,
            "record": record,
            "ttft_ms": None if record is None else record.get("ttft_ms"),
            "median_ttft_ms": None if record is None else record.get("median_ttft_ms"),
            "kinds": None if record is None else record.get("kinds"),
        },
        "fields_present": present,
        "fields_missing": missing,
        "fields_null_by_design": by_design,
        "fields_unchecked": unchecked,
        "log_line": "not checked"
        if log_records is None
        else ("found" if log_line is not None else "not found"),
        "trace_received": None if traced is None or trace_id is None else trace_id in traced,
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) if names else "none"


def render(report: dict[str, Any]) -> str:
    """The docs' section of a stored report."""
    begin, end = markers(report["simulated"])
    steady = report["steady"]
    planted = report["planted"]
    engine = (
        "simulated replicas (the default model's CPU profile, in real time)"
        if report["simulated"]
        else "the default model on vLLM-CPU"
    )
    counted = report["counted_after_steady"]
    lines = [
        begin,
        "",
        f"Measured at {short_commit(report['git_commit'])} (`{report['command']}`): one local "
        f"region, {engine}, {report['replicas']} replicas, one gateway, traces on (to an "
        "OTLP receiver in the tool), `telemetry.outlier_*` at their defaults (factor "
        f"{report['factor']:g}, judged from the {report['min_samples']}th request, a window "
        f"of {report['window_samples']:,}).",
        "",
        "| phase | requests | prompt tokens | TTFT p50 | TTFT p99 | captures |",
        "|---|---|---|---|---|---|",
        f"| steady, {report['concurrency']} in flight, {report['max_tokens']} output tokens "
        f"| {steady['requests']} ({steady['failed']} failed) "
        f"| {_tokens(steady['prompt_tokens_mean'])} | {_ms(steady['ttft_p50_ms'])} "
        f"| {_ms(steady['ttft_p99_ms'])} | {report['false_captures']} (false) |",
        f"| planted | 1 | {_tokens(planted['prompt_tokens'])} "
        f"| {_ms(planted['client_ttft_ms'])} | | "
        f"{'captured' if planted['captured'] else 'not captured'} |",
        "",
        f"Steady phase: {report['false_captures']} false captures "
        f"(`firstlight_outliers_total`: {counted.get('ttft', 0):.0f} ttft, "
        f"{counted.get('e2e', 0):.0f} e2e). TTFT measured by the client.",
    ]
    if planted["captured"]:
        ratio = (
            planted["ttft_ms"] / planted["median_ttft_ms"]
            if planted["ttft_ms"] is not None and planted["median_ttft_ms"]
            else None
        )
        times = "" if ratio is None else f" ({ratio:.0f} times)"
        lines.append(
            f"Planted request: captured as {', '.join(planted['kinds'] or [])}; TTFT at the "
            f"gateway {_ms(planted['ttft_ms'])} against a median of "
            f"{_ms(planted['median_ttft_ms'])}{times}."
        )
        lines.append(f"Fields present: {_names(report['fields_present'])}.")
        if report["fields_null_by_design"]:
            lines.append(
                f"Null as the table specifies for a request served in its own region: "
                f"{_names(report['fields_null_by_design'])}."
            )
        lines.append(f"Fields missing: {_names(report['fields_missing'])}.")
        if report["fields_unchecked"]:
            lines.append(
                f"Not checked (the gateway's log was not readable): "
                f"{_names(report['fields_unchecked'])}."
            )
        received = {True: "it arrived at", False: "it did not arrive at", None: "not checked at"}
        lines.append(
            f"The WARNING log line: {report['log_line']}; the trace id: "
            f"{received[report['trace_received']]} the OTLP receiver."
        )
    else:
        problem = f" ({planted['problem']})" if planted["problem"] else ""
        lines.append(f"Planted request: not captured{problem}.")
    lines += ["", end]
    return "\n".join(lines)


def _tokens(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


app = typer.Typer(add_completion=False)


@app.command()
def outliers(
    engine: Annotated[
        options.EngineKind, typer.Option(help="Simulated replicas or vLLM-CPU.")
    ] = options.EngineKind.SIM,
    requests: Annotated[int, typer.Option(min=1, help="Steady requests (>= min_samples).")] = 1000,
    concurrency: Annotated[int, typer.Option(min=1, help="Steady requests in flight.")] = 4,
    seed: options.SeedOption = 0,
    cache_dir: Annotated[Path | None, typer.Option(help="The config's cache_dir.")] = None,
    out: options.OutOption = None,
    page: options.PageOption = None,
    tables_only: options.TablesOnlyOption = False,
) -> None:
    """Outlier capture on one local region (run as firstlight bench outliers): a steady
    phase that should capture nothing, then a planted slow request that should be captured
    with every field. Prints the JSON report and the page's section, stores the report
    with --out, rewrites --page's section (--tables-only: only that, from --out)."""
    if options.rewrote_tables(out, page, tables_only, _rewrite):
        return
    import ray

    from firstlight.serve.local_mode import start_local, stop_local
    from firstlight.serve.startup_watch import ray_logs

    with trace_receiver() as (receiver, otlp_port):
        config = region_config(engine.value, free_port(), otlp_port, cache_dir)
        if requests < config.telemetry.outlier_min_samples:
            raise typer.BadParameter(
                f"{requests}: at least telemetry.outlier_min_samples "
                f"({config.telemetry.outlier_min_samples}), or nothing is judged",
                param_hint="--requests",
            )
        running = start_local(config, timeout_s=600)
        try:
            logs = ray_logs()
            logs_dir = None if logs is None else logs.logs_dir
            plant = planted_messages(seed, PLANTED_CHARS[engine.value])
            measured = measure(running.endpoints[REGION], logs_dir, requests, concurrency, plant)
        finally:
            stop_local(running)
            ray.shutdown()
        traced = set(receiver.trace_ids)  # the spans flushed at shutdown are in too
    report = {
        **run_header(),
        "simulated": engine is options.EngineKind.SIM,
        "requests": requests,
        "concurrency": concurrency,
        "max_tokens": MAX_TOKENS,
        "replicas": REPLICAS,
        "factor": config.telemetry.outlier_factor,
        "min_samples": config.telemetry.outlier_min_samples,
        "window_samples": config.telemetry.outlier_window_samples,
        "planted_chars": PLANTED_CHARS[engine.value],
        **summarize(**measured, traced=traced),  # measure's keys are summarize's arguments
        "asked": [a.row() for a in [*measured["steady"], measured["planted"]]],
    }
    emit(report, out / "results.json" if out else None)
    typer.echo(render(report))
    if page is not None:
        _rewrite(page, report)


def _rewrite(page: Path, report: dict[str, Any]) -> None:
    begin, end = markers(report["simulated"])
    page.write_text(replace_tables(page.read_text(), render(report), begin=begin, end=end))
