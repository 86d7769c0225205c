"""Cache-index faults: how fast wrong-hint routing stops after each, on the real path.

Run ``firstlight bench index-faults`` (options ``--trials 20 --faults FAULT`` (repeated;
default: every one) ``--prefix-blocks 16 --redis-url URL --timeout-s 10 --out FOLDER
--page PAGE``, and ``--tables-only`` to re-render the page from a stored report). Redis
must answer at ``--redis-url``; every key is written under a key prefix of the run's own
and deleted at the end. No Ray cluster and no model are started.

In one process, as ``firstlight bench route-share`` does, run the replica side and a
gateway's router side of one model in one region:

* the replica: vLLM's KV-event wire format (topic, sequence number, vLLM's own msgpack
  ``KVEventBatch``) on a real ZMQ socket, read by the vLLM adapter
  (:meth:`~firstlight.engine.vllm_engine.VllmEngine.cache_events`) and published by
  :class:`~firstlight.serve.model_server.ModelServer`'s own hint bridge (its
  ``_publish_hints`` task, flushing every 100 ms) through
  :class:`~firstlight.hints.HintPublisher` into Redis;
* the router: a :class:`~firstlight.hints.HintMirror` kept by a
  :class:`~firstlight.hints.HintSubscriber`, built as the gateway's request router builds
  them, and a :class:`~firstlight.region.RouterState` with the configured policy, pricing
  a request for a prefix the faulty replica held, beside an idle replica holding nothing.

Per fault and trial the replica first stores the prefix and the router credits it (and
picks it); 0 to 200 ms later (at random, so engine events meet the bridge's flush cycle at
any phase) the fault happens at its source, at t0, and the router is asked in a tight
loop (yielding to the event loop, never sleeping) until it no longer credits the replica
with any block of that prefix: t1 is the start of that first healed decision. Reported:
t1 - t0 per trial, p50/p99/max per fault, and the verdict against the 2 s goal.
:data:`FAULTS` says where t0 is taken and what is not covered here; the replica side,
the router side and the trials are :mod:`firstlight_bench.tools.index_faults_run`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight.config import PlatformConfig
from firstlight.quantiles import percentile
from firstlight_bench import options
from firstlight_bench.reports.results import run_header, short_commit
from firstlight_bench.reports.sections import replace_tables
from firstlight_bench.tools.engine import emit
from firstlight_bench.tools.index_faults_run import measure

__all__ = [
    "FAULTS",
    "GOAL_S",
    "INDEX_BEGIN",
    "INDEX_END",
    "Fault",
    "app",
    "render",
    "render_report",
    "summarize",
]

INDEX_BEGIN = (
    "<!-- index-faults:begin (generated from docs/benchmarks/index-faults/results.json; "
    "do not edit) -->"
)
INDEX_END = "<!-- index-faults:end -->"
GOAL_S = 2.0
"""The goal: wrong-hint routing stops within this long after each fault."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One cache-index fault: where its t0 is taken and what of its path runs here."""

    name: str
    t0: str
    """The moment at the fault's source the time is measured from."""
    path: str
    """What runs between t0 and the router's healed decision."""
    not_covered: str
    """What of the production path does not run here."""


_ENGINE_PATH = (
    "ZMQ → vLLM adapter → ModelServer hint bridge (100 ms flush) → HintPublisher → "
    "Redis feed → HintSubscriber → HintMirror → policy"
)
FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "cache-reset",
            "the engine publishes `AllBlocksCleared`",
            _ENGINE_PATH,
            "a running vLLM engine and its publisher thread (the batch is sent in vLLM's "
            "wire format by this process)",
        ),
        Fault(
            "sequence-gap",
            "the engine publishes the batch after the lost one (the gap shows then)",
            _ENGINE_PATH,
            "the wait for that next batch: an engine emits one per step with cache "
            "changes, none while idle; a running vLLM engine",
        ),
        Fault(
            "engine-restart",
            "the restarted replica's hint bridge starts with a newer epoch, same replica id",
            "ModelServer hint bridge (`start_epoch`) → HintPublisher → Redis feed → "
            "HintSubscriber → HintMirror (older epoch dropped) → policy",
            "the engine's start-up and Ray's first call to the new replica, which starts "
            "its bridge; Ray Serve never restarts a replica actor (`max_restarts=0`), a "
            "replacement comes with a new id: the removal row",
        ),
        Fault(
            "replica-removal",
            "the router applies the replica-set update without the replica",
            "`RouterState.replica_set` + `RouterState.set_replicas`, as the request "
            "router's `update_replicas` calls them",
            "Ray's controller noticing the replica go and long-polling the new set to "
            "the router (needs a Ray cluster)",
        ),
    )
}
"""The faults measured, in the report's order."""


def summarize(samples: Sequence[dict[str, Any]], goal_s: float = GOAL_S) -> list[dict[str, Any]]:
    """Per fault (in :data:`FAULTS` order): trials, how many healed, p50/p99/max of the
    heal time in ms, and whether every trial healed within ``goal_s``."""
    rows = []
    for name, fault in FAULTS.items():
        mine = [s for s in samples if s["fault"] == name]
        if not mine:
            continue
        times = sorted(float(s["heal_ms"]) for s in mine if s["healed"])
        quantiles = {q: percentile(times, v) for q, v in (("p50", 0.5), ("p99", 0.99))}
        longest = times[-1] if times else None
        rows.append(
            {
                "fault": name,
                "trials": len(mine),
                "healed": len(times),
                **{f"{q}_ms": None if v is None else round(v, 3) for q, v in quantiles.items()},
                "max_ms": longest,
                "meets_goal": len(times) == len(mine) and longest is not None
                and longest <= goal_s * 1000.0,
                "t0": fault.t0,
                "path": fault.path,
                "not_covered": fault.not_covered,
            }
        )  # fmt: skip
    return rows


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}" if value >= 1 else f"{value:.3f}"


def render(report: dict[str, Any]) -> str:
    """The generated section of ``docs/reliability.md`` (markers included)."""
    lines = [
        INDEX_BEGIN,
        "",
        f"Measured at {short_commit(report['git_commit'])} (`{report['command']}`): "
        f"{report['trials']} trials per fault, a {report['prefix_blocks']}-block prefix, "
        "real Redis and ZMQ, replica and router in one process, each fault 0 to 200 ms after "
        "the router first credited the prefix. Time from the fault at its source until the "
        "router credits the replica with none of the prefix, in ms:",
        "",
        "| fault | t0: the moment … | healed | p50 | p99 | max | within 2 s |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in report["summary"]:
        lines.append(
            f"| {row['fault']} | {row['t0']} | {row['healed']}/{row['trials']} | "
            f"{_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} | {_ms(row['max_ms'])} | "
            f"{'**yes**' if row['meets_goal'] else '**no**'} |"
        )
    lines += ["", "Not covered here:", ""]
    lines += [f"* {row['fault']}: {row['not_covered']}." for row in report["summary"]]
    lines += ["", INDEX_END]
    return "\n".join(lines)


def render_report(report: dict[str, Any]) -> str:
    """The run folder's ``report.md``: the page's section, each fault's path, the verdict."""
    machine = report["machine"]
    body = render(report).removeprefix(INDEX_BEGIN).removesuffix(INDEX_END).strip()
    lines = [
        "# Cache-index faults: time until wrong-hint routing stops",
        "",
        f"`{report['command']}` at {short_commit(report['git_commit'])}, {report['time']}, "
        f"{machine['cpu']} ({machine['cores']} cores), Python {machine['python']}.",
        "",
        body,
        "",
        "What runs between t0 and the healed decision:",
        "",
    ]
    lines += [f"* {row['fault']}: {row['path']}." for row in report["summary"]]
    feed = report["feed"]
    lines += [
        "",
        f"The router's hint feed: {feed['reconnects']} reconnects, {feed['bootstraps']} "
        f"bootstraps, {feed['events_applied']} events applied.",
        "",
        f"Verdict against the {report['goal_s']:g} s goal: {report['verdict']}.",
        "",
    ]
    return "\n".join(lines)


class FaultName(StrEnum):
    """A fault ``--faults`` names: the keys of :data:`FAULTS`."""

    CACHE_RESET = "cache-reset"
    SEQUENCE_GAP = "sequence-gap"
    ENGINE_RESTART = "engine-restart"
    REPLICA_REMOVAL = "replica-removal"


app = typer.Typer(add_completion=False)


@app.command()
def index_faults(
    trials: Annotated[int, typer.Option(min=1, help="Trials per fault.")] = 20,
    faults: Annotated[
        list[FaultName] | None, typer.Option(help="A fault to run (repeat; default: all).")
    ] = None,
    prefix_blocks: Annotated[int, typer.Option(min=1, help="Blocks of the prefix.")] = 16,
    redis_url: Annotated[
        str, typer.Option(help="Where Redis answers.")
    ] = "redis://127.0.0.1:6379/0",
    timeout_s: Annotated[float, typer.Option(help="Longest wait for set-up and heal.")] = 10.0,
    out: options.OutOption = None,
    page: options.PageOption = None,
    tables_only: options.TablesOnlyOption = False,
) -> None:
    """How fast wrong-hint routing stops after each cache-index fault, on the real path
    (run as firstlight bench index-faults; Redis at --redis-url). Prints the JSON report
    and the page's section, stores the report and report.md with --out, rewrites --page's
    section (--tables-only: only that, from --out)."""
    if options.rewrote_tables(out, page, tables_only, _rewrite):
        return
    if not timeout_s > 0:
        raise typer.BadParameter(f"{timeout_s:g}: must be more than 0", param_hint="--timeout-s")
    chosen = list(dict.fromkeys(f.value for f in faults)) if faults else list(FAULTS)
    measured = asyncio.run(
        measure(
            chosen, trials, redis_url=redis_url, blocks=prefix_blocks, timeout_s=timeout_s,
        )
    )  # fmt: skip
    samples = measured["samples"]
    summary = summarize(samples)
    report = {
        **run_header(),
        "simulated": False,
        "goal_s": GOAL_S,
        "trials": trials,
        "prefix_blocks": prefix_blocks,
        "policy": PlatformConfig().router.policy,
        "verdict": "met by every fault"
        if all(row["meets_goal"] for row in summary)
        else "missed by " + ", ".join(row["fault"] for row in summary if not row["meets_goal"]),
        "summary": summary,
        "feed": measured["feed"],
        "samples": samples,
    }
    emit(report, out / "results.json" if out else None)
    if out is not None:
        (out / "report.md").write_text(render_report(report))
    typer.echo(render(report))
    if page is not None:
        _rewrite(page, report)


def _rewrite(page: Path, report: dict[str, Any]) -> None:
    page.write_text(
        replace_tables(page.read_text(), render(report), begin=INDEX_BEGIN, end=INDEX_END)
    )
