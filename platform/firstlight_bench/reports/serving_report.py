"""The serving benchmark's statistics and report, pure: what
:func:`firstlight_bench.tools.serving.serving` turns its timings into.

Called by :mod:`firstlight_bench.tools.serving` and by its tests; every percentile is the
project's one (:func:`firstlight.quantiles.percentile`, interpolating).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from firstlight.quantiles import percentile

__all__ = [
    "TARGET_ADDED_P50_MS",
    "TARGET_GATEWAY_SCALING",
    "Summary",
    "Timing",
    "added_latency",
    "capacity",
    "hops",
    "markers",
    "phase",
    "plot_hops",
    "render",
    "render_markdown",
    "summarize",
    "target",
    "throughput",
]

TARGET_ADDED_P50_MS = 3.0
"""An earlier issue's goal, kept in the stored reports' ``target`` (the page shows the
current goals, :data:`GOAL_ADDED_MS`)."""
GOAL_ADDED_MS = {"p50": 5.0, "p99": 15.0}
"""Issue 40's goals: TTFT added over the in-process engine at p50 and p99, and below the
bare Ray Serve app of the same shape measured in the same run."""
GOAL_REQUESTS_PER_GATEWAY_CORE = 3 * 128.0
"""Issue 40's goal: three times the ~128 requests/s per gateway core of the run at
9f8ec11 (97.7 requests/s with 0.76 gateway cores)."""
TARGET_GATEWAY_SCALING = 1.7
"""The issue's goal: requests/s with 2 gateways at least 1.7 times those with 1."""
_METRICS = ("ttft_ms", "e2e_ms")

Timing = tuple[float, float]
"""(TTFT, end-to-end) of one request, milliseconds."""
Summary = dict[str, dict[str, float]]


def _pct(samples: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``samples`` by the project's one percentile
    (:func:`firstlight.quantiles.percentile`); ``ValueError`` for none."""
    value = percentile(sorted(samples), q)
    if value is None:
        raise ValueError(f"quantile {q} of no samples")
    return value


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Count, mean, p50, p90 and p99 of ``samples`` (3 decimals)."""
    stats = {f"p{q}": _pct(samples, q / 100) for q in (50, 90, 99)}
    stats["mean"] = sum(samples) / len(samples)
    return {"n": len(samples), **{k: round(v, 3) for k, v in stats.items()}}


def phase(timings: Sequence[Timing]) -> Summary:
    """Summaries of one path's TTFTs and end-to-end times."""
    return {
        "ttft_ms": summarize([t for t, _ in timings]),
        "e2e_ms": summarize([e for _, e in timings]),
    }


def added_latency(base: Summary, other: Summary) -> Summary:
    """``other - base`` at p50 and p99, per metric."""
    return {m: {q: round(other[m][q] - base[m][q], 3) for q in ("p50", "p99")} for m in _METRICS}


def throughput(
    latencies_ms: Sequence[float], elapsed_s: float, errors: int, concurrency: int
) -> dict[str, float]:
    """One closed-loop level: completed requests/s and latency percentiles."""
    done = len(latencies_ms)
    return {
        "concurrency": concurrency,
        "requests": done,
        "errors": errors,
        "elapsed_s": round(elapsed_s, 3),
        "requests_per_s": round(done / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "p50_ms": round(_pct(latencies_ms, 0.5), 3) if done else math.nan,
        "p99_ms": round(_pct(latencies_ms, 0.99), 3) if done else math.nan,
    }


def capacity(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Requests/s per gateway count from the capacity blocks' ``rows`` (each a
    :func:`throughput` row with ``gateways`` and ``cores``): per count and concurrency
    the mean over blocks, the count's capacity (its best level), and the scaling of the
    most gateways over the fewest against :data:`TARGET_GATEWAY_SCALING`, with the cores
    the machine was using at each count's best level (what limited it)."""
    by_count: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for row in rows:
        by_count.setdefault(row["gateways"], {}).setdefault(row["concurrency"], []).append(row)
    counts: dict[str, Any] = {}
    for gateways, levels in sorted(by_count.items()):
        means = {c: sum(r["requests_per_s"] for r in rs) / len(rs) for c, rs in levels.items()}
        best = max(means, key=lambda c: means[c])
        cores = [r["cores"] for r in levels[best]]
        counts[str(gateways)] = {
            "requests_per_s": round(means[best], 1),
            "at_concurrency": best,
            "cores_total": round(sum(sum(c.values()) for c in cores) / len(cores), 2),
            "cores": {g: round(sum(c[g] for c in cores) / len(cores), 2) for g in cores[0]},
        }
    fewest, most = min(by_count), max(by_count)
    base = counts[str(fewest)]["requests_per_s"]
    if fewest == most or base <= 0:  # nothing to compare: no verdict
        return {"by_gateways": counts, "scaling": None}
    ratio = counts[str(most)]["requests_per_s"] / base
    return {
        "by_gateways": counts,
        "scaling": {
            "gateways": [fewest, most],
            "ratio": round(ratio, 3),
            "goal": TARGET_GATEWAY_SCALING,
            "met": ratio >= TARGET_GATEWAY_SCALING,
        },
    }


def target(added: Summary) -> dict[str, Any]:
    """Whether ``http_tokens - direct`` meets the issue's goal (added p50 ≤ 3 ms)."""
    ttft, e2e = added["ttft_ms"]["p50"], added["e2e_ms"]["p50"]
    return {
        "p50_ms": TARGET_ADDED_P50_MS,
        "ttft_added_p50_ms": ttft,
        "ttft_met": ttft <= TARGET_ADDED_P50_MS,
        "e2e_added_p50_ms": e2e,
        "e2e_met": e2e <= TARGET_ADDED_P50_MS,
    }


def _row(label: str, cells: Sequence[Any], fmt: str = ".3f") -> str:
    shown = (format(c, fmt) if isinstance(c, float) else str(c) for c in cells)
    return f"{label:<30}" + "".join(f"{s:>10}" for s in shown)


def render(report: dict[str, Any]) -> str:
    """The report as a readable table."""
    meta, overhead = report["meta"], report["overhead"]
    opts, target = meta["options"], overhead["target"]
    lines = [
        "Firstlight serving benchmark: SIMULATED ENGINE (sim profile 'instant'), REAL PLATFORM",
        f"machine: os.cpu_count()={meta['cpu_count']}, {meta['platform']}, Python "
        f"{meta['python']}, Ray {meta['ray']} (num_cpus=2; this process's clients share "
        f"the same cores); ingress {meta.get('ingress', 'serve-proxy')}, "
        f"RAY_SERVE_THROUGHPUT_OPTIMIZED={meta['serve_throughput_optimized']}",
        f"overhead: {opts['requests']} sequential requests per path (+{meta['warm_up']} warm-up)"
        f", {opts['prompt_tokens']} prompt tokens, max_tokens={opts['max_tokens']}, "
        f"2 replicas; {meta['hints']}",
        "",
        _row("path (ms)", ["TTFT p50", "p90", "p99", "e2e p50", "p90", "p99"]),
    ]
    for name, s in overhead["paths"].items():
        lines.append(_row(name, [s[m][q] for m in _METRICS for q in ("p50", "p90", "p99")]))
    lines += ["", _row("added (ms, diff of pctiles)", ["TTFT p50", "p99", "e2e p50", "p99"])]
    for name, a in overhead["added_ms"].items():
        lines.append(_row(name, [a[m][q] for m in _METRICS for q in ("p50", "p99")], "+.3f"))
    verdict = {True: "MET", False: "NOT MET"}
    lines += [
        "",
        f"target: added p50 <= {target['p50_ms']} ms (http_tokens - direct): "
        f"TTFT {target['ttft_added_p50_ms']:+.3f} ms {verdict[target['ttft_met']]}; "
        f"e2e {target['e2e_added_p50_ms']:+.3f} ms {verdict[target['e2e_met']]}",
        "",
        "throughput per gateway count (non-streaming chat, max_tokens=1, closed loop, "
        f"{opts['duration']:g} s per level; clients share the cores with Ray)",
        _row("gateways/block/concurrency", ["req/s", "p50 ms", "p99 ms", "errors", "cores"]),
    ]
    for r in report["throughput"]:
        cells = [r["requests_per_s"], r["p50_ms"], r["p99_ms"], r["errors"]]
        cells.append(round(sum(r["cores"].values()), 2))
        lines.append(_row(f"{r['gateways']}/{r['block']}/{r['concurrency']}", cells))
    scaling = report["capacity"]["scaling"]
    if scaling is not None:
        lines.append(
            f"scaling {scaling['gateways'][1]} over {scaling['gateways'][0]} gateways: "
            f"x{scaling['ratio']:.2f} (goal >= {scaling['goal']}) {verdict[scaling['met']]}"
        )
    for kill in report.get("kills", []):
        if "error" in kill:
            lines.append(f"gateway kill, {kill['client']} clients, did not run: {kill['error']}")
            continue
        lines.append(
            f"one of {kill['gateways']} gateways killed under load, {kill['client']} clients: "
            f"{kill['requests']} requests, {kill['lost']} failed ({kill['lost_in_flight']} in "
            f"flight at the kill), {kill['served_after_kill']} served after it; "
            f"{kill['problems']}"
        )
    return "\n".join(lines)


# --- the generated sections of docs/serving.md ------------------------------------------

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
