"""``firstlight bench suite``: the benchmark matrix behind ``docs/benchmarks.md``.

Runs each entry of :data:`SUITE` — every workload, the published presets — through every
arm at :data:`LOADS` on :data:`SEEDS` (``firstlight bench sim``'s sweep, tasks in
parallel processes) into ``<out>/<name>/``, then rewrites the generated part of the
benchmarks page from whatever run folders ``<out>`` holds (:func:`render_tables`), so no
figure in it is typed by hand; ``tests/bench/test_benchmarks_doc.py`` holds the page to
the stored ``results.json`` files. W7 needs the Mooncake trace (``--trace PATH``);
without it that entry is skipped, said so. One stored run's tables are
:mod:`firstlight_bench.reports.suite_tables`'s, the page's markers
:mod:`firstlight_bench.reports.sections`'.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firstlight.errors import ConfigError, ConfigProblem
from firstlight_bench.reports.sections import BEGIN, END
from firstlight_bench.reports.suite_goals import goals_table
from firstlight_bench.reports.suite_tables import run_tables
from firstlight_bench.simulator.cluster import ARMS, CROSS_REGION_ARMS

__all__ = [
    "LOADS",
    "SEEDS",
    "SUITE",
    "SuiteEntry",
    "render_tables",
    "run_suite",
]

LOADS = (0.5, 0.75, 0.9, 1.0, 1.2)
SEEDS = (0, 1, 2)


@dataclass(frozen=True, slots=True)
class SuiteEntry:
    """One run folder of the matrix."""

    name: str
    workload: str
    requests: int
    params: Mapping[str, Any] = field(default_factory=dict)
    preset: str | None = None
    needs_trace: bool = False
    loads: tuple[float, ...] | None = None
    """Its own loads (a stress entry beyond the matrix); ``None``: the run's loads."""
    gateways: int = 1
    """Gateways (routers) per region."""
    route_share_ms: float | None = 1.0
    """With several gateways: the route share's delay (``None``: routers do not share)."""
    in_goals: bool = True
    """Counted by the goals table (``False``: a study of a non-default setting)."""
    regions: int = 4
    replicas: int = 16
    """Per region."""
    profile: str = "h100-llama-8b"
    arms: tuple[str, ...] | None = None
    """Its own arms; ``None``: every in-region arm (the cross-region ones are W6's)."""
    wan_gbps: float | None = None
    """The warm region priced (``firstlight bench sim --wan-gbps``)."""
    hindsight_share: float = 1.0
    """With ``wan_gbps``: the share of warm requests replayed in hindsight."""
    seeds: tuple[int, ...] | None = None
    """Its own seeds (``None``: the run's)."""
    unseen: bool = False
    """A fleet shape and seed set no routing parameter was tuned on: left out of the
    matrix's goals whatever ``in_goals`` says, counted by a goal row of its own (the
    in-region "no loss" check)."""


SUITE: tuple[SuiteEntry, ...] = (
    SuiteEntry("w1", "W1", 6000),
    SuiteEntry("w1-llmd-b2b-saas", "W1", 6000, preset="llmd-b2b-saas"),
    SuiteEntry("w1-sglang-gsp", "W1", 6000, preset="sglang-gsp"),
    SuiteEntry("w2", "W2", 6000),
    SuiteEntry("w3", "W3", 6000),
    SuiteEntry("w4", "W4", 6000),
    SuiteEntry("w5", "W5", 6000),
    SuiteEntry(
        "w6",
        "W6",
        3000,
        loads=(0.5, 0.7),
        regions=4,
        replicas=2,
        profile="h100x4-llama-70b",
        arms=(
            "firstlight",
            "firstlight_local",
            "cache_aware",
            "dynamo_kv",
            "llmd_sticky",
            *CROSS_REGION_ARMS,
        ),
    ),
    SuiteEntry(
        "w6-small",
        "W6",
        2000,
        params={
            "period_s": 600.0,
            "output_tokens": 16,
            "outage_region": None,
            "brownout_region": None,
        },
        loads=(0.6, 0.8),
        regions=3,
        replicas=1,
        profile="cpu-smollm2-135m",
        arms=("firstlight", "firstlight_local", "cache_aware", *CROSS_REGION_ARMS),
    ),
    SuiteEntry("w7", "W7", 3000, needs_trace=True),
    SuiteEntry(
        "w7-moving",
        "W7",
        3000,
        params={"move_probability": 0.5},
        needs_trace=True,
        loads=(0.5, 0.8),
        regions=3,
        replicas=2,
        arms=("firstlight", "firstlight_local", "cache_aware"),
        wan_gbps=40.0,
        in_goals=False,
    ),
    SuiteEntry(
        "w2-unseen",
        "W2",
        6000,
        regions=3,
        replicas=5,
        profile="a100-llama-8b",
        seeds=(101, 102, 103),
        unseen=True,
    ),
    SuiteEntry(
        "w4-unseen",
        "W4",
        6000,
        regions=2,
        replicas=8,
        profile="l4-llama-8b",
        seeds=(201, 202, 203),
        unseen=True,
    ),
    SuiteEntry("w8", "W8", 6000),
    SuiteEntry("w1-overload", "W1", 6000, loads=(2.0, 4.0, 6.0, 8.0)),
    SuiteEntry("w2-gateways2", "W2", 6000, gateways=2),
    SuiteEntry(
        "w2-gateways2-unshared", "W2", 6000, gateways=2, route_share_ms=None, in_goals=False
    ),
)
"""The matrix. W7 runs 3,000 requests: its prompts average 11,000 tokens, and a request
costs the simulator about ten times a W1 one. ``w1-overload`` is a stress entry beyond
the matrix: load 1.0 is what the cache-blind ``least_queue`` sustains, and the
prefix-aware arms only saturate on W1 several times beyond it (the goals table counts
only the matrix's loads). ``w2-gateways2`` is W2 through two gateways per region, the
deployed default, sharing their routes; ``w2-gateways2-unshared`` the same without the
share, a study the goals table does not count. ``w6-small`` is a second fleet shape for
the day — three regions of one slow replica with a tight cache, where copying a prefix
to another region is expensive — and the shape the live platform replays
(``live-sim-w6``), without the outage and brownout. ``w7-moving`` is the warm region
priced: W7's conversations on three regions, half of their later turns arriving from
another region than the last one, with KV pulls over a 40 Gbit/s link (about what one
GPU-to-GPU transfer over 100 GbE TCP moves, llm-d's networking blog, 2026-06) and every
warm request's three ways replayed in hindsight; a study the goals table does not
count. ``w2-unseen`` and ``w4-unseen`` are in-region checks on fleet shapes, GPU
profiles and seeds that no routing parameter was tuned on (W2 on 3 x 5 A100s, W4 on
2 x 8 L4s); the goals table counts them in a row of their own."""


def _entries(only: Sequence[str] | None) -> list[SuiteEntry]:
    if not only:
        return list(SUITE)
    known = {e.name: e for e in SUITE}
    unknown = [n for n in only if n not in known]
    if unknown:
        message = f"unknown {', '.join(unknown)}; entries are {', '.join(known)}"
        raise ConfigError([ConfigProblem("only", message, list(only), True)])
    return [known[n] for n in only]


def run_suite(
    *,
    out: Path,
    only: Sequence[str] | None = None,
    trace: str | None = None,
    requests: int | None = None,
    seeds: Sequence[int] = SEEDS,
    loads: Sequence[float] = LOADS,
    jobs: int = 1,
    command: str | None = None,
    arms: Sequence[str] | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Path]:
    """Run the matrix (or the entries named in ``only``) into ``out``; returns the run
    folders written. ``requests`` overrides every entry's request count (smoke runs).
    ``arms`` re-measures only those arms of each entry that has them, into its stored
    run (:mod:`firstlight_bench.remeasure`). Raises :class:`ConfigError` for an unknown
    entry or arm, or a stored run of another shape than the re-measure's."""
    import tempfile

    from firstlight_bench.remeasure import merge_arms
    from firstlight_bench.reports.report import write_run
    from firstlight_bench.simulator.sim import run_sim
    from firstlight_bench.workloads.presets import resolve_preset

    if arms is not None:
        unknown = [a for a in arms if a not in ARMS]
        if unknown or not arms:
            message = f"unknown {', '.join(unknown)}; arms are {', '.join(ARMS)}"
            raise ConfigError([ConfigProblem("arms", message, list(arms), True)])
    written = []
    for entry in _entries(only):
        params = dict(entry.params)
        workload = entry.workload
        if entry.preset is not None:
            workload, params = resolve_preset(entry.preset, params)
        if entry.needs_trace:
            if not trace:
                progress(f"{entry.name}: skipped, it needs the Mooncake trace (--trace PATH)")
                continue
            params["trace"] = trace
        folder = out / entry.name
        entry_arms = entry.arms or tuple(a for a in ARMS if a not in CROSS_REGION_ARMS)
        if arms is not None:
            entry_arms = tuple(a for a in entry_arms if a in arms)
            if not entry_arms:
                progress(f"{entry.name}: skipped, it runs none of {', '.join(arms)}")
                continue
        scratch = tempfile.TemporaryDirectory() if arms is not None else None
        progress(f"{entry.name}: {workload} {params or ''}")
        run_sim(
            workload=workload,
            regions=entry.regions,
            replicas=entry.replicas,
            profile=entry.profile,
            seeds=entry.seeds or seeds,
            arms=entry_arms,
            loads=entry.loads or loads,
            out=folder if scratch is None else Path(scratch.name),
            requests=requests or entry.requests,
            gateways=entry.gateways,
            route_share_ms=entry.route_share_ms,
            wan_gbps=entry.wan_gbps,
            hindsight_share=entry.hindsight_share,
            params=params,
            command=command,
            jobs=jobs,
            progress=progress,
        )
        if scratch is not None:
            with scratch:
                merged = merge_arms(folder, Path(scratch.name), entry_arms)
            write_run(folder, merged["meta"], merged["points"])
        written.append(folder)
    return written


# --- the tables -------------------------------------------------------------------------


def render_tables(folder: Path, link_base: str = "benchmarks/suite") -> str:
    """The generated part of the benchmarks page, from every ``<folder>/*/results.json``
    (in :data:`SUITE` order, then by name), each entry with its TTFT plot, linked as
    ``<link_base>/<entry>/ttft_vs_load.png`` (the folder as the page sees it)."""
    order = {e.name: i for i, e in enumerate(SUITE)}
    runs = sorted(
        (p.parent.name for p in folder.glob("*/results.json")),
        key=lambda n: (order.get(n, len(order)), n),
    )
    lines = [BEGIN, ""]
    if not runs:
        lines += ["No suite run is stored yet.", ""]
    loaded = {name: json.loads((folder / name / "results.json").read_text()) for name in runs}
    if loaded:
        studies = {e.name for e in SUITE if not e.in_goals or e.unseen}
        counted = {name: data for name, data in loaded.items() if name not in studies}
        expected = [e.name for e in SUITE if e.loads is None and e.name not in studies]
        unseen = {e.name for e in SUITE if e.unseen}
        checks = {name: data for name, data in loaded.items() if name in unseen}
        lines += ["### The goals", ""]
        lines += goals_table(counted, expected, LOADS, unseen=checks)
    for name, data in loaded.items():
        lines += run_tables(name, data, link_base)
    lines.append(END)
    return "\n".join(lines)
