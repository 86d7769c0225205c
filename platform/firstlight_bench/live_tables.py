"""The live runs' tables on the benchmarks page, generated from their stored folders.

A section of a page between ``<!-- live:NAME:begin ... -->`` and ``<!-- live:NAME:end -->``
is the table of the run stored in ``<stored>/NAME/results.json`` (written by
``firstlight bench live`` or ``bench run``): one row per arm, headed by the command,
commit and engines that made it. :func:`render_live_sections` rewrites every such
section of a page; ``firstlight bench suite --tables-only`` calls it with the suite's
tables, and ``tests/bench/test_benchmarks_doc.py`` holds the page to the stored runs, so
no live figure is typed by hand either.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from firstlight_bench.results import short_commit

__all__ = ["live_table", "render_live_sections"]

_SECTION = re.compile(
    r"<!-- live:(?P<name>[A-Za-z0-9._-]+):begin[^>]*-->.*?<!-- live:(?P=name):end -->",
    re.DOTALL,
)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def live_table(name: str, data: dict[str, Any]) -> str:
    """The section for the run ``name`` (its ``results.json`` as ``data``), markers
    included."""
    meta, points = data["meta"], data["points"]
    workload, config = meta["workload"], meta["config"]
    engines = ", ".join(config.get("engines", [])) or "as configured"
    label = "simulated engines, real platform" if meta["simulated"] else "real engines"
    commit = short_commit(str(meta["git_commit"]))
    lines = [
        f"<!-- live:{name}:begin (generated from docs/benchmarks/{name}/results.json; "
        "do not edit) -->",
        "",
        f"`{meta['command']}` at commit `{commit}`: {workload['name']}, "
        f"{workload['requests']} requests at {workload['rate_rps']:g} req/s, engines: "
        f"{engines} ({label}); [report](benchmarks/{name}/report.md).",
        "",
        "| arm | TTFT p50 / p90 / p99 ms | TPOT p50 / p99 ms | hit % | cross-region % "
        "| completed / errors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for point in points:
        ttft, tpot = point["ttft_ms"], point["tpot_ms"]
        lines.append(
            f"| {point['arm']} | {_ms(ttft['p50'])} / {_ms(ttft['p90'])} / {_ms(ttft['p99'])} "
            f"| {_ms(tpot['p50'])} / {_ms(tpot['p99'])} | {_pct(point['prefix_hit_rate'])} "
            f"| {_pct(point['cross_region_share'])} | {point['completed']} / {point['errors']} |"
        )
    lines += ["", f"<!-- live:{name}:end -->"]
    return "\n".join(lines)


def render_live_sections(page: str, stored: Path) -> str:
    """``page`` with every live section regenerated from ``stored/NAME/results.json``.
    Raises ``FileNotFoundError`` when a section names a run that is not stored."""

    def table(match: re.Match[str]) -> str:
        name = match.group("name")
        data = json.loads((stored / name / "results.json").read_text())
        return live_table(name, data)

    return _SECTION.sub(table, page)
