"""The serving benchmark's statistics and report, pure: what
:func:`firstlight_bench.serving.main` turns its timings into.

Called by :mod:`firstlight_bench.serving` and by its tests; every percentile is the
project's one (:func:`firstlight.telemetry.rolling.percentile`, interpolating).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from firstlight.telemetry.rolling import percentile

__all__ = [
    "TARGET_ADDED_P50_MS",
    "Summary",
    "Timing",
    "added_latency",
    "markers",
    "phase",
    "render",
    "render_markdown",
    "summarize",
    "target",
    "throughput",
]

TARGET_ADDED_P50_MS = 3.0
_METRICS = ("ttft_ms", "e2e_ms")

Timing = tuple[float, float]
"""(TTFT, end-to-end) of one request, milliseconds."""
Summary = dict[str, dict[str, float]]


def _pct(samples: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``samples`` by the project's one percentile
    (:func:`firstlight.telemetry.rolling.percentile`); ``ValueError`` for none."""
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
        "throughput, one gateway replica (non-streaming chat, max_tokens=1, closed loop, "
        f"{opts['duration']:g} s per level; clients share the 2 cores with Ray)",
        _row("concurrency", ["req/s", "p50 ms", "p99 ms", "requests", "errors"]),
    ]
    for r in report["throughput"]:
        cells = [r["requests_per_s"], r["p50_ms"], r["p99_ms"], r["requests"], r["errors"]]
        lines.append(_row(str(r["concurrency"]), cells))
    return "\n".join(lines)


# --- the generated sections of docs/serving.md ------------------------------------------

_PATH_LABELS = {
    "direct": "engine called directly (in process)",
    "handle": "Ray handle + FirstlightRequestRouter (no HTTP)",
    "http_floor": "`GET /healthz` (ingress + gateway, no model call)",
    "ray_serve_floor": "bare Ray Serve app of the same shape (ingress → 2 replicas, SSE)",
    "http_tokens": "**Firstlight**, `/v1/completions` with token ids, streamed",
    "http_chat_text": "Firstlight, `/v1/chat/completions` with text",
}


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
    from firstlight_bench.results import short_commit

    meta, overhead = report["meta"], report["overhead"]
    opts, goal = meta["options"], overhead["target"]
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
    verdict = {True: "met", False: "**missed**"}
    added = overhead["added_ms"]["http_tokens - ray_serve_floor"]
    lines += [
        "",
        f"Added over the engine at p50 (goal ≤ {goal['p50_ms']:g} ms): TTFT "
        f"+{goal['ttft_added_p50_ms']:.2f} ms ({verdict[goal['ttft_met']]}), end-to-end "
        f"+{goal['e2e_added_p50_ms']:.2f} ms ({verdict[goal['e2e_met']]}); Firstlight's own "
        f"work over the bare Ray Serve app: TTFT {added['ttft_ms']['p50']:+.2f} ms.",
        "",
        f"One gateway replica, non-streaming chat, `max_tokens=1`, closed loop, "
        f"{opts['duration']:g} s per level (the clients share the cores):",
        "",
        "| concurrency | requests/s | p50 ms | p99 ms | errors |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in report["throughput"]:
        lines.append(
            f"| {row['concurrency']} | {row['requests_per_s']:.1f} | {row['p50_ms']:.1f} | "
            f"{row['p99_ms']:.1f} | {row['errors']} |"
        )
    lines += ["", end]
    return "\n".join(lines)
