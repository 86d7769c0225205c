"""A stored soak run as markdown: the doc section (:func:`render`, between
:data:`SOAK_BEGIN` and :data:`SOAK_END`) and the run folder's ``report.md``.

``firstlight bench soak`` stores a run with :func:`write_run` (``--out``) and
rewrites a doc page's section with :func:`rewrite_page` (``--page``; ``--tables-only``
re-renders it from the stored ``results.json``). Everything here reads the stored record
(a ``dict`` as in ``results.json``: :func:`firstlight_bench.reports.results.run_header`'s fields,
the platform's shape and :class:`firstlight_bench.tools.soak.SoakReport`'s fields), so the
page can always be regenerated from the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from firstlight_bench.reports.results import short_commit
from firstlight_bench.reports.sections import replace_tables

__all__ = [
    "SOAK_BEGIN",
    "SOAK_END",
    "gateway_rows",
    "has_markers",
    "render",
    "report_markdown",
    "rewrite_page",
    "rss_growth",
    "write_run",
]

SOAK_BEGIN = (
    "<!-- soak:begin (generated from docs/benchmarks/soak-sim/results.json; do not edit) -->"
)
SOAK_END = "<!-- soak:end -->"
_MIB = 1024.0 * 1024.0


def rss_growth(run: Mapping[str, Any], process: str) -> tuple[float, float]:
    """RSS of ``process`` at the end of the warm-up and at the end, MiB."""
    samples = run["rss_mib"][process]
    return float(run["rss_mib_at_warmup"].get(process, samples[0])), float(samples[-1])


def _span_min(run: Mapping[str, Any]) -> float:
    return (float(run["duration_s"]) - float(run["warmup_s"])) / 60.0


def gateway_rows(run: Mapping[str, Any]) -> list[tuple[str, float, float, float, float, float]]:
    """Per traced gateway: ``(process, RSS growth, traced growth, tracemalloc's tables'
    growth, the baseline's transient, not explained)`` in MiB over the measured span. The
    transient is how much RSS rose while the baseline snapshot was taken (freed after,
    but kept by the allocator; RSS at the end of the warm-up is read before it); *not
    explained* is what the other three leave of the RSS growth."""
    rows = []
    after = run.get("rss_mib_after_baseline") or {}
    for process, grown in sorted(run["memory"].items()):
        if process not in run["rss_mib"]:
            continue
        first, last = rss_growth(run, process)
        traced = grown["traced_growth_bytes"] / _MIB
        tables = grown["tracemalloc_growth_bytes"] / _MIB
        transient = after[process] - first if process in after else 0.0
        rest = last - first - traced - tables - transient
        rows.append((process, last - first, traced, tables, transient, rest))
    return rows


def _intro(run: Mapping[str, Any]) -> list[str]:
    frames = int(run["tracemalloc_frames"])
    traced = (
        f"Every gateway traced its Python allocations with `tracemalloc` ({frames} frames "
        "per traceback) from before the load, took a baseline at the end of the warm-up and "
        "compared at the end; RSS was read before each snapshot. Tracing costs the gateways "
        "CPU: latencies of this run are not those of an untraced one."
        if frames
        else "The gateways did not trace their allocations (`--no-tracemalloc`)."
    )
    problems = ", ".join(f"{p}: {n}" for p, n in sorted(run["problems"].items()))
    return [
        f"Measured at {short_commit(run['git_commit'])} (`{run['command']}`): "
        f"{_minutes(run['duration_s'] / 60)} minutes of steady load on {run['regions']} "
        "local regions "
        f"({run['model_replicas']} model replicas and {run['gateways_per_region']} gateways "
        f"each; sim engine, so **simulated** serving on a real Ray cluster), "
        f"{run['clients_per_region']} closed-loop clients per region, streamed and "
        f"non-streamed. Memory growth is measured from the end of the warm-up "
        f"({_minutes(run['warmup_s'] / 60)} min) to the end: the last "
        f"{_minutes(_span_min(run))} minutes. " + traced,
        "",
        f"{run['requests']:,} requests: **{run['lost']} lost**, {run['hung']} hung"
        + (f" ({problems})." if problems else "."),
    ]


def _rss_table(run: Mapping[str, Any]) -> list[str]:
    span = _span_min(run)
    lines = [
        "| process | RSS at warm-up end (MiB) | RSS at the end (MiB) | growth | per minute |",
        "|---|---|---|---|---|",
    ]
    for process in sorted(run["rss_mib"]):
        first, last = rss_growth(run, process)
        per_min = (last - first) / span if span > 0 else 0.0
        lines.append(
            f"| {process} | {first:.1f} | {last:.1f} | {(last - first) / first * 100:+.1f} % "
            f"| {per_min:+.3f} MiB |"
        )
    return lines


def _tasks_table(run: Mapping[str, Any]) -> list[str]:
    lines = [
        "| gateway | asyncio tasks idle before | under load (min to max) | idle after |",
        "|---|---|---|---|",
    ]
    for region in sorted(run["tasks_idle_before"]):
        loaded = run["tasks_under_load"].get(region) or [0]
        lines.append(
            f"| {region} | {run['tasks_idle_before'][region]} | {min(loaded)} to {max(loaded)} "
            f"| {run['tasks_idle_after'].get(region, '-')} |"
        )
    return lines


def _explained_table(run: Mapping[str, Any]) -> list[str]:
    lines = [
        f"Where each gateway's RSS growth over the last {_minutes(_span_min(run))} minutes "
        "went (MiB): *traced* is the net growth of the Python allocations tracemalloc saw "
        "(alive at the end and not at the baseline, minus the reverse; it includes the "
        "baseline's own census, owner `firstlight.telemetry.memory`), *tracemalloc's "
        "tables* the tracer's own memory (not traced), *baseline snapshot* how much RSS "
        "rose while the baseline was taken (freed, but kept by the allocator: a cost of "
        "measuring), *not explained* the rest (allocator fragmentation, memory of C "
        "libraries that bypass Python's allocator).",
        "",
        "| gateway | RSS growth | traced | tracemalloc's tables | baseline snapshot "
        "| not explained |",
        "|---|---|---|---|---|---|",
    ]
    for process, rss, traced, tables, transient, rest in gateway_rows(run):
        lines.append(
            f"| {process} | {rss:+.2f} | {traced:+.2f} | {tables:+.2f} | {transient:+.2f} "
            f"| {rest:+.2f} |"
        )
    return lines


def _minutes(value: float) -> str:
    return f"{value:.4g}"


def _kib(value: float | None) -> str:
    return "·" if value is None else f"{value / 1024:+,.0f}"


def _owners_table(run: Mapping[str, Any]) -> list[str]:
    memory: Mapping[str, Any] = run["memory"]
    gateways = sorted(memory)
    by_owner: dict[str, dict[str, Mapping[str, Any]]] = {}
    for process in gateways:
        for owner in memory[process]["owners"]:
            by_owner.setdefault(owner["owner"], {})[process] = owner
    ranked = sorted(
        by_owner, key=lambda o: (-sum(e["size_bytes"] for e in by_owner[o].values()), o)
    )
    top = max((len(memory[p]["owners"]) for p in gateways), default=0)
    lines = [
        "Owners of the traced growth (KiB, net): an allocation's owner is the innermost "
        "module outside the standard library in its traceback, `firstlight` modules whole, "
        f"other packages by their first two names; · = not among that gateway's top {top}.",
        "",
        "| owner | " + " | ".join(gateways) + " | where it grew most |",
        "|---|" + "---|" * len(gateways) + "---|",
    ]
    for owner in ranked:
        entries = by_owner[owner]
        cells = " | ".join(_kib(entries[p]["size_bytes"] if p in entries else None)
                           for p in gateways)  # fmt: skip
        site = max(entries.values(), key=lambda e: e["site_bytes"])
        lines.append(f"| `{owner}` | {cells} | `{site['site']}` ({_kib(site['site_bytes'])}) |")
    other = " | ".join(_kib(memory[p]["other_bytes"]) for p in gateways)
    total = " | ".join(_kib(memory[p]["traced_growth_bytes"]) for p in gateways)
    lines += [f"| other owners | {other} | |", f"| **all traced** | {total} | |"]
    return lines


def _notes(run: Mapping[str, Any]) -> list[str]:
    lines = []
    for region, blocks in sorted(run["hint_blocks"].items()):
        lines.append(
            f"* Hint mirror of {region}: {blocks[0]:,} entries at the first sample, "
            f"{max(blocks):,} at most, {blocks[-1]:,} at the last."
        )
    for region in sorted(run["ttft_ms_first_minute"]):
        first, last = run["ttft_ms_first_minute"][region], run["ttft_ms_last_minute"].get(region)
        lines.append(f"* TTFT p99 in {region}: first minute {_ms(first)}, last {_ms(last)}.")
    lines += [f"* Not measured: {problem}." for problem in run.get("memory_problems", [])]
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def render(run: Mapping[str, Any]) -> str:
    """The doc section of a stored run, markers included."""
    lines = [SOAK_BEGIN, "", *_intro(run), "", *_rss_table(run), "", *_tasks_table(run)]
    if run["memory"]:
        lines += ["", *_explained_table(run), "", *_owners_table(run)]
    lines += ["", *_notes(run), "", SOAK_END]
    return "\n".join(lines)


def _series(
    times: Sequence[float], columns: Mapping[str, Mapping[float, float]], title: str
) -> list[str]:
    names = sorted(columns)
    lines = [title, "", "| min | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for at in times:
        cells = " | ".join(f"{columns[n][at]:.1f}" if at in columns[n] else "" for n in names)
        lines.append(f"| {at / 60:.1f} | {cells} |")
    return lines


def report_markdown(run: Mapping[str, Any]) -> str:
    """``report.md`` of a run folder: the doc section, then every sample."""
    times = [round(float(t), 1) for t in run["sample_at_s"]]
    rss = {p: dict(zip(times, samples, strict=False)) for p, samples in run["rss_mib"].items()}
    lines = ["# Soak run", "", render(run), "", *_series(times, rss, "## RSS per sample (MiB)")]
    if run["traced_mib"]:
        traced = {p: {float(t): v for t, v in points} for p, points in run["traced_mib"].items()}
        lines += ["", *_series(times, traced, "## Traced Python memory per gateway (MiB)")]
    return "\n".join(lines) + "\n"


def write_run(out: Path, run: Mapping[str, Any]) -> None:
    """Store ``run`` as ``out/results.json`` and ``out/report.md`` (``out`` created)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(run, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(run))


def has_markers(page: Path) -> bool:
    """Whether ``page`` exists and holds a section to rewrite (checked before a run)."""
    if not page.is_file():
        return False
    text = page.read_text()
    return 0 <= text.find(SOAK_BEGIN) < text.find(SOAK_END)


def rewrite_page(page: Path, run: Mapping[str, Any]) -> None:
    """Replace ``page``'s section between :data:`SOAK_BEGIN` and :data:`SOAK_END` with
    :func:`render` of ``run``; raises ``ValueError`` when the page has no such markers."""
    page.write_text(replace_tables(page.read_text(), render(run), begin=SOAK_BEGIN, end=SOAK_END))
