"""The generated sections of ``docs/serving.md`` from a stored serving run: the page's
markers, its markdown (the added latency, the capacity per gateway count, the killed
gateway) and the ``hops.png`` picture of where the TTFT goes.

Called by :mod:`firstlight_bench.tools.serving` (``--page`` and ``--tables-only``) and by
the tests that hold the page to the stored runs; the statistics and goals it shows are
:mod:`firstlight_bench.reports.serving_report`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from firstlight_bench.reports.serving_report import (
    GOAL_ADDED_MS,
    GOAL_REQUESTS_PER_GATEWAY_CORE,
)

__all__ = ["hops", "markers", "plot_hops", "render_markdown"]

_PATH_LABELS = {
    "direct": "engine called directly (in process)",
    "port": "a replica's own port from the benchmark's process (no HTTP, no routing)",
    "handle": "Ray handle + FirstlightRequestRouter (no HTTP)",
    "http_floor": "`GET /healthz` (ingress + gateway, no model call)",
    "ray_serve_floor": "bare Ray Serve app of the same shape (ingress → 2 replicas, SSE)",
    "http_tokens": "**Firstlight**, `/v1/completions` with token ids, streamed",
    "http_chat_text": "Firstlight, `/v1/chat/completions` with text",
}


def hops(report: dict[str, Any]) -> list[tuple[str, float]] | None:
    """``http_tokens``'s TTFT p50 split by hop, in ms (differences of medians, so the
    parts add up to the whole only roughly): the engine, the replica port's hop, the
    ingress with the gateway's HTTP (``GET /healthz``), and the gateway's own work on a
    completion, with the routing decision's mean inside it. ``None`` for a report
    without the ``port`` path (made before it existed)."""
    overhead = report["overhead"]
    p50 = {path: stats["ttft_ms"]["p50"] for path, stats in overhead["paths"].items()}
    if "port" not in p50:
        return None
    parts = [
        ("engine (in process)", p50["direct"]),
        ("replica port hop", p50["port"] - p50["direct"]),
        ("ingress + gateway HTTP (`GET /healthz`)", p50["http_floor"]),
        (
            "gateway's own work (auth, validation, tokenizing, hashes, decision, SSE)",
            p50["http_tokens"] - p50["http_floor"] - p50["port"],
        ),
    ]
    decision_us = overhead.get("decision_mean_us")
    if decision_us is not None:
        parts.append(("of which the routing decision (mean)", decision_us / 1000.0))
    return parts


def plot_hops(report: dict[str, Any], path: Path) -> None:
    """``hops.png``: :func:`hops` as one stacked bar (the decision drawn inside the
    gateway's work). Called by ``firstlight bench serving --out``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    parts = hops(report)
    if parts is None:
        return
    figure = Figure(figsize=(9, 3.2), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    left = 0.0
    colors = ("#4c72b0", "#55a868", "#c44e52", "#8172b2")
    for (label, ms), color in zip(parts[:4], colors, strict=True):
        width = max(ms, 0.0)
        plain = label.replace("`", "")
        axes.barh(0, width, left=left, color=color, label=f"{plain}: {ms:.2f} ms")
        left += width
    if len(parts) > 4:
        label, ms = parts[4]
        axes.barh(0, ms, left=left - max(parts[3][1], 0.0), height=0.3, color="#222222",
                  label=f"{label}: {ms:.3f} ms")  # fmt: skip
    axes.set_yticks([])
    axes.set_xlabel("TTFT p50 of a streamed completion through the platform, ms")
    figure.legend(loc="outside lower center", ncol=2, fontsize=8)
    axes.set_title(f"{report['meta']['ingress']}: where a request's first-token time goes")
    figure.savefig(path, format="png")


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of run ``name``'s generated section on a page."""
    return (
        f"<!-- serving:{name}:begin (generated from docs/benchmarks/{name}/results.json; "
        "do not edit) -->",
        f"<!-- serving:{name}:end -->",
    )


def render_markdown(report: dict[str, Any], name: str) -> str:
    """Run ``name``'s section of ``docs/serving.md``, between its :func:`markers`: where
    and how it was measured, every path's latencies, the added latency against the goal,
    and one gateway's throughput. Called by ``firstlight bench serving --page`` and by
    the test that holds the page to the stored reports."""
    from firstlight_bench.reports.results import short_commit

    meta, overhead = report["meta"], report["overhead"]
    opts = meta["options"]
    begin, end = markers(name)
    optimized = "on" if meta["serve_throughput_optimized"] == "1" else "off"
    lines = [
        begin,
        "",
        f"`{meta['command']}` at commit `{short_commit(meta['git_commit'])}`: ingress "
        f"`{meta['ingress']}`, throughput-optimized data plane {optimized}; "
        f"{opts['requests']} sequential requests per path after {meta['warm_up']} warm-up, "
        f"{opts['prompt_tokens']} prompt tokens, `max_tokens={opts['max_tokens']}`; "
        f"{meta['cpu_count']} cores, Ray {meta['ray']}. *Simulated engine, real platform.*",
        "",
        "| path | TTFT p50 | p90 | p99 | end-to-end p50 | p99 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for path, stats in overhead["paths"].items():
        ttft, e2e = stats["ttft_ms"], stats["e2e_ms"]
        cells = [ttft["p50"], ttft["p90"], ttft["p99"], e2e["p50"], e2e["p99"]]
        label = _PATH_LABELS.get(path, path)
        lines.append(f"| {label} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    parts = hops(report)
    if parts is not None:
        lines += [
            "",
            "`/v1/completions` streamed, TTFT p50 by hop (differences of medians):",
            "",
            "| hop | ms |",
            "|---|---:|",
            *(f"| {label} | {ms:.2f} |" for label, ms in parts),
            "",
            f"![TTFT p50 by hop](benchmarks/{name}/hops.png)",
        ]
    verdict = {True: "met", False: "**missed**"}
    added = overhead["added_ms"]["http_tokens - ray_serve_floor"]["ttft_ms"]
    engine = overhead["added_ms"]["http_tokens - direct"]["ttft_ms"]
    over_engine = ", ".join(
        f"{q} +{engine[q]:.2f} ms (goal ≤ {GOAL_ADDED_MS[q]:g}: "
        f"{verdict[engine[q] <= GOAL_ADDED_MS[q]]})"
        for q in ("p50", "p99")
    )
    lines += [
        "",
        f"TTFT added over the engine: {over_engine}. Firstlight over the bare Ray Serve "
        f"app: p50 {added['p50']:+.2f} ms, p99 {added['p99']:+.2f} ms (goal: below it: "
        f"{verdict[added['p50'] < 0 and added['p99'] < 0]}).",
        "",
        *_capacity_markdown(report, opts["duration"]),
        *_kill_markdown(report.get("kills", [])),
        end,
    ]
    return "\n".join(lines)


def _capacity_markdown(report: dict[str, Any], duration_s: float) -> list[str]:
    """The throughput table per gateway count (blocks averaged), the cores each group of
    processes used at each count's best level, and the scaling verdict. A report from
    before gateway counts were compared (no ``capacity``) shows its one gateway's table."""
    if "capacity" not in report:
        return _one_gateway_markdown(report["throughput"], duration_s)
    cap = report["capacity"]
    lines = [
        f"Closed-loop clients, non-streamed chat, `max_tokens=1`, {duration_s:g} s per level, "
        "the gateway counts in A B B A blocks (the clients share the cores); requests/s, "
        "mean of the blocks:",
        "",
        "| gateways | concurrency | requests/s | p50 ms | p99 ms | errors | cores used |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cells: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in report["throughput"]:
        cells.setdefault((row["gateways"], row["concurrency"]), []).append(row)
    for (gateways, concurrency), rows in sorted(cells.items()):
        n = len(rows)
        mean = {k: sum(r[k] for r in rows) / n for k in ("requests_per_s", "p50_ms", "p99_ms")}
        cores = sum(sum(r["cores"].values()) for r in rows) / n
        lines.append(
            f"| {gateways} | {concurrency} | {mean['requests_per_s']:.1f} | "
            f"{mean['p50_ms']:.1f} | {mean['p99_ms']:.1f} | {sum(r['errors'] for r in rows)} | "
            f"{cores:.2f} |"
        )
    groups = list(next(iter(cap["by_gateways"].values()))["cores"])
    lines += [
        "",
        "Cores used at each gateway count's best level, by process group:",
        "",
        "| gateways | requests/s | " + " | ".join(groups) + " | total |",
        "|---:|---:|" + "---:|" * (len(groups) + 1),
    ]
    for gateways, best in cap["by_gateways"].items():
        shares = " | ".join(f"{best['cores'][g]:.2f}" for g in groups)
        lines.append(
            f"| {gateways} | {best['requests_per_s']:.1f} | {shares} | {best['cores_total']:.2f} |"
        )
    one = cap["by_gateways"].get("1")
    if one is not None and one["cores"].get("gateways"):
        per_core = one["requests_per_s"] / one["cores"]["gateways"]
        met = "met" if per_core >= GOAL_REQUESTS_PER_GATEWAY_CORE else "**missed**"
        lines += [
            "",
            f"One gateway's requests/s per core it used: {per_core:.0f} "
            f"(goal ≥ {GOAL_REQUESTS_PER_GATEWAY_CORE:g}: {met}).",
        ]
    scaling = cap["scaling"]
    lines.append("")
    if scaling is not None:
        verdict = "met" if scaling["met"] else "**missed**"
        fewest, most = scaling["gateways"]
        lines += [
            f"Capacity with {most} gateways ÷ with {fewest}: x{scaling['ratio']:.2f} "
            f"(goal ≥ {scaling['goal']:g}: {verdict}).",
            "",
        ]
    return lines


def _one_gateway_markdown(rows: Sequence[dict[str, Any]], duration_s: float) -> list[str]:
    lines = [
        f"One gateway replica, non-streaming chat, `max_tokens=1`, closed loop, "
        f"{duration_s:g} s per level (the clients share the cores):",
        "",
        "| concurrency | requests/s | p50 ms | p99 ms | errors |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['concurrency']} | {row['requests_per_s']:.1f} | {row['p50_ms']:.1f} | "
            f"{row['p99_ms']:.1f} | {row['errors']} |"
        )
    return [*lines, ""]


_KILL_CLIENT_LABELS = {
    "httpx": "plain HTTP (httpx), no retries",
    "openai": "the official `openai` client, its default retries (2)",
}


def _kill_markdown(kills: Sequence[dict[str, Any]]) -> list[str]:
    """The gateway-kill runs' counts, one row per client, or nothing when the run had
    none. The goal (no failed request) is judged on the official client, which is what
    applications use; the plain client shows what a client that retries nothing sees."""
    if not kills:
        return []
    ran = [k for k in kills if "error" not in k]
    first = ran[0] if ran else {"gateways": "?", "clients": "?", "max_tokens": "?"}
    lines = [
        f"One of {first['gateways']} gateways killed (`ray.kill`, no graceful stop) under "
        f"{first['clients']} steady clients (streamed and non-streamed chat in turn, "
        f"`max_tokens={first['max_tokens']}`, every answer checked), once per client; the "
        "victim is a gateway the region's scrape shows answering, and the replacement "
        "counts once it answers too:",
        "",
        "| client | requests | failed | of which in flight at the kill | served after the kill "
        "| replacement answering after |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kill in ran:
        label = _KILL_CLIENT_LABELS.get(kill["client"], kill["client"])
        lines.append(
            f"| {label} | {kill['requests']} | {kill['lost']} | {kill['lost_in_flight']} | "
            f"{kill['served_after_kill']} | {kill['replaced_after_s']:.1f} s |"
        )
    lines.append("")
    for kill in kills:
        label = _KILL_CLIENT_LABELS.get(kill["client"], kill["client"])
        if "error" in kill:
            lines.append(f"- {label}: did not run (`{kill['error'][:120]}`).")
            continue
        problems = "; ".join(f"`{p[:80].rstrip('.')}`" for p in kill["problems"]) or "none"
        lines.append(f"- {label}: {problems}.")
    judged = next((k for k in ran if k["client"] == "openai"), None)
    lines.append("")
    if judged is None:
        lines.append(
            "Failed requests while a gateway is killed: not judged (no official-client run)."
        )
    else:
        verdict = "met" if judged["lost"] == 0 else "**missed**"
        lines.append(
            f"Failed requests while a gateway is killed, official client (goal 0): "
            f"{judged['lost']} ({verdict})."
        )
    return [*lines, ""]
