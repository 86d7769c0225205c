"""The data-path spike's report: the paths it compares, the page section's markers and its
markdown (``docs/architecture.md``, "One hop for the tokens").

Called by :mod:`firstlight_bench.tools.data_path` (``--page``, ``--tables-only``) and by
the test that holds the page to the stored report.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PATHS", "markers", "render_markdown"]

PATHS = ("bare_asgi", "direct_ingress", "replica_port", "handle")
_LABELS = {
    "bare_asgi": "plain uvicorn app, no Ray (the floor)",
    "direct_ingress": "HAProxy → the replica as its own ingress (Ray direct ingress)",
    "replica_port": "HAProxy → ingress → the replica's own port",
    "handle": "HAProxy → ingress → Ray handle → replica (the former path)",
}


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of run ``name``'s generated section on a page."""
    return (
        f"<!-- data-path:{name}:begin (generated from docs/benchmarks/{name}/results.json; "
        "do not edit) -->",
        f"<!-- data-path:{name}:end -->",
    )


def render_markdown(report: dict[str, Any], name: str) -> str:
    """Run ``name``'s section: where it was measured, each path's latency and rate.
    Called by ``--page`` and by the test that holds the page to the stored report."""
    from firstlight_bench.reports.results import short_commit

    meta, paths = report["meta"], report["paths"]
    begin, end = markers(name)
    options = meta["options"]
    lines = [
        begin,
        "",
        f"`{meta['command']}` at commit `{short_commit(meta['git_commit'])}`: "
        f"{options['requests']} sequential streamed requests per path after {meta['warm_up']} "
        f"warm-up, {options['items']} stream items each; then {options['concurrency']} "
        f"closed-loop clients for {options['duration']} s per path and block; "
        f"{meta['cpu_count']} cores, Ray {meta['ray']}. *No engine: transport only.*",
        "",
        "| path | TTFT p50 ms | p90 | p99 | end-to-end p50 | p99 | requests/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for path in PATHS:
        t, e = paths[path]["ttft_ms"], paths[path]["e2e_ms"]
        rate = report["requests_per_s"][path]["mean"]
        lines.append(
            f"| {_LABELS[path]} | {t['p50']:.2f} | {t['p90']:.2f} | {t['p99']:.2f} "
            f"| {e['p50']:.2f} | {e['p99']:.2f} | {rate:.1f} |"
        )
    lines += ["", end]
    return "\n".join(lines)
