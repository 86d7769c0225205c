"""Per-request outcomes in, one benchmark result point out; the results file's schema.

The simulator and the load driver record one :class:`Outcome` per request, per arm and
offered load; :func:`summarize` turns them into one *point* of ``results.json``, whose
whole shape (``{"meta": {...}, "points": [...]}``) is
:data:`firstlight_bench.reports.results_schema.RESULTS_SCHEMA`;
:func:`~firstlight_bench.reports.results_schema.validate_results` checks a file against it
before :func:`firstlight_bench.reports.report.write_run` writes it.

Definitions (times in the client's view, trace seconds; reported in ms or µs):

* a request *completed* when ``error is None``; every other request is an error;
* TTFT = ``first_token_s - arrival_s``;
* TPOT = ``(finish_s - first_token_s) / (output_tokens - 1)``, for requests with at
  least 2 output tokens;
* e2e = ``finish_s - arrival_s``;
* percentiles (TTFT p50/p90/p99, TPOT and e2e p50/p99) are over completed requests, by
  linear interpolation between closest ranks
  (:func:`firstlight.quantiles.percentile`);
* ``prefix_hit_rate`` = Σ ``cached_tokens`` / Σ ``prompt_tokens`` over completed requests
  (token-weighted);
* ``goodput`` = fraction of *all* requests that completed with TTFT ≤ the first SLO
  pair's TTFT and TPOT ≤ its TPOT (a request with fewer than 2 output tokens has no
  TPOT and meets that half vacuously); ``goodput_by_slo`` gives it for every pair,
  keyed ``"<ttft>ms/<tpot>ms"``;
* ``cross_region_share`` = fraction of completed requests (with a known serving
  region) served outside the client's region;
* ``decision_us`` p50/p99 = router decision time over the requests that measured it
  (in the simulator: the policy's choice and its bookkeeping after it);
* ``floor_ttft_ms`` p50/p90/p99 = the same percentiles of the requests' ``floor``
  reference TTFTs (:mod:`firstlight_bench.simulator.floor`), over all requests of the trace, and
  ``ttft_vs_floor`` p50/p90 = the arm's TTFT percentile over the floor's (a ratio of
  percentiles, not a percentile of ratios); only when the caller passes the floors;
* ``seed`` = the trace's seed, when a run holds several (a point is one arm at one load
  on one seed's trace);
* ``imbalance`` = max/mean outstanding requests per replica, time-averaged — computed
  by the caller and stored as given.

An empty set gives ``null`` (a percentile with no samples, a ratio with a zero
denominator), never NaN: JSON has no NaN.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from firstlight.quantiles import percentile

# Re-exported: the schema is part of what a results file is.
from firstlight_bench.reports.results_schema import RESULTS_SCHEMA, validate_results

__all__ = [
    "DEFAULT_SLOS",
    "RESULTS_SCHEMA",
    "Outcome",
    "Slo",
    "cpu_model",
    "git_commit",
    "read_report",
    "run_header",
    "short_commit",
    "slo_key",
    "summarize",
    "validate_results",
]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's fate as its client saw it: the benchmark's one record of a request.

    Built by the simulator and the load driver (one per request, per arm and offered
    load: what :func:`summarize` turns into a result point), and by every tool that
    measures requests one by one: the closed loop
    (:class:`firstlight_bench.clients.closed_loop.Answer` holds one), the peers, advisor, RAG and
    outlier benchmarks. Times are seconds on the client's time base (the trace's for the
    simulator and the replay, the loop's start for the closed loop, a clock's reading
    for the others); the durations derived from them are in ms. A field a tool does not
    measure keeps its default (0 tokens, no region or replica). Raises ``ValueError``
    when the fields contradict each other (negative counts, times out of order, a
    completed request without ``finish_s``).
    """

    request_id: str
    arrival_s: float
    """When the client sent it."""
    first_token_s: float | None
    """When the client saw the first token; ``None`` when it failed before one."""
    finish_s: float | None
    """When the client saw the last token; for a failed request ``None``, or when the
    client gave up on it where the tool records that (the closed loop, the peers and
    outlier benchmarks do)."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    """Tokens received."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache (0 if unknown)."""
    client_region: int = 0
    served_region: int | None = None
    """The index of the region that served it, among the client's targets."""
    replica: str | None = None
    error: str | None = None
    """``None`` when it completed; otherwise the error's kind or message."""
    decision_us: float | None = None
    """Router decision time for this request; ``None`` if not measured."""
    predicted_ttft_ms: float | None = None
    """The TTFT the router predicted for the route it chose, counted from arrival (the
    cost-model arms in the simulator); ``None`` where nothing predicted it."""

    def __post_init__(self) -> None:
        rid = self.request_id
        for name in ("prompt_tokens", "output_tokens", "cached_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"request {rid!r}: {name} = {getattr(self, name)} is negative")
        if self.cached_tokens > self.prompt_tokens:
            raise ValueError(
                f"request {rid!r}: cached_tokens = {self.cached_tokens} exceeds "
                f"prompt_tokens = {self.prompt_tokens}"
            )
        if self.error is None and self.finish_s is None:
            raise ValueError(f"request {rid!r}: completed (error is None) but finish_s is None")
        if self.error is None and self.first_token_s is None and self.output_tokens > 0:
            raise ValueError(
                f"request {rid!r}: completed with {self.output_tokens} output tokens "
                "but first_token_s is None"
            )
        if self.first_token_s is not None and self.first_token_s < self.arrival_s:
            raise ValueError(
                f"request {rid!r}: first_token_s = {self.first_token_s} precedes "
                f"arrival_s = {self.arrival_s}"
            )
        start = self.arrival_s if self.first_token_s is None else self.first_token_s
        if self.finish_s is not None and self.finish_s < start:
            raise ValueError(
                f"request {rid!r}: finish_s = {self.finish_s} precedes {start} "
                "(first token or arrival)"
            )

    @property
    def completed(self) -> bool:
        """Whether the request completed (``error is None``)."""
        return self.error is None

    @property
    def ttft_ms(self) -> float | None:
        """Time to first token in ms; ``None`` without a first token."""
        if self.first_token_s is None:
            return None
        return (self.first_token_s - self.arrival_s) * 1000.0

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first, in ms; ``None`` below 2 tokens."""
        if self.first_token_s is None or self.finish_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) * 1000.0 / (self.output_tokens - 1)

    @property
    def e2e_ms(self) -> float | None:
        """Arrival to last token in ms; ``None`` when it did not finish."""
        if self.finish_s is None:
            return None
        return (self.finish_s - self.arrival_s) * 1000.0


@dataclass(frozen=True, slots=True)
class Slo:
    """A goodput objective pair: a request meets it with TTFT ≤ ``ttft_ms`` and TPOT ≤
    ``tpot_ms``."""

    ttft_ms: float
    tpot_ms: float

    def __post_init__(self) -> None:
        if not (self.ttft_ms > 0 and self.tpot_ms > 0):
            raise ValueError(f"Slo(ttft_ms={self.ttft_ms}, tpot_ms={self.tpot_ms}): must be > 0")

    def met_by(self, outcome: Outcome) -> bool:
        """Whether ``outcome`` completed within this objective pair."""
        ttft, tpot = outcome.ttft_ms, outcome.tpot_ms
        return (
            outcome.completed
            and (ttft is None or ttft <= self.ttft_ms)
            and (tpot is None or tpot <= self.tpot_ms)
        )


DEFAULT_SLOS: tuple[Slo, ...] = (Slo(500, 30), Slo(2000, 100))
"""The SLO pairs of BENCHMARKS.md; the first one defines ``goodput``."""


def slo_key(slo: Slo) -> str:
    """The ``goodput_by_slo`` key of ``slo``, e.g. ``"500ms/30ms"``."""
    return f"{slo.ttft_ms:g}ms/{slo.tpot_ms:g}ms"


def _percentiles(values: list[float], names: Sequence[str]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {name: percentile(ordered, int(name[1:]) / 100) for name in names}


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def summarize(
    arm: str,
    load: float,
    outcomes: Sequence[Outcome],
    *,
    imbalance: float,
    slos: Sequence[Slo] = DEFAULT_SLOS,
    duration_s: float | None = None,
    seed: int | None = None,
    floor_ttft_ms: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One result point: the metrics of ``arm`` at offered ``load`` (module docstring).

    Called by the simulator and the load driver once per arm and load. With
    ``duration_s`` (the measured span of the run) the point also carries
    ``duration_s``, ``throughput_rps`` (completed requests per second) and
    ``output_tokens_per_s``; with ``seed``, ``seed``; with ``floor_ttft_ms`` (every
    request's floor TTFT), ``floor_ttft_ms`` and ``ttft_vs_floor``. Raises
    ``ValueError`` for an empty arm name, no SLO pairs, or a non-finite ``load``,
    ``imbalance`` or ``duration_s``.
    """
    if not arm:
        raise ValueError("arm: must not be empty")
    if not slos:
        raise ValueError("slos: at least one SLO pair is needed (the first defines goodput)")
    if not math.isfinite(load):
        raise ValueError(f"load = {load!r}: must be finite")
    if not (math.isfinite(imbalance) and imbalance >= 0):
        raise ValueError(f"imbalance = {imbalance!r}: must be finite and >= 0")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s = {duration_s!r}: must be finite and > 0")

    done = [o for o in outcomes if o.completed]
    ttft = [v for o in done if (v := o.ttft_ms) is not None]
    tpot = [v for o in done if (v := o.tpot_ms) is not None]
    e2e = [v for o in done if (v := o.e2e_ms) is not None]
    decision = [o.decision_us for o in outcomes if o.decision_us is not None]
    # Absolute percentage error of the chosen route's predicted TTFT (the issue's
    # "prediction" goal: llm-d reports about 5 % on a homogeneous pool).
    errors = [
        abs(o.predicted_ttft_ms - measured) / measured
        for o in done
        if o.predicted_ttft_ms is not None and (measured := o.ttft_ms)
    ]
    located = [o for o in done if o.served_region is not None]
    cross = sum(1 for o in located if o.served_region != o.client_region)
    goodput_by_slo = {
        slo_key(slo): _ratio(sum(1 for o in done if slo.met_by(o)), len(outcomes)) for slo in slos
    }
    point: dict[str, Any] = {
        "arm": arm,
        "load": float(load),
        "ttft_ms": _percentiles(ttft, ("p50", "p90", "p99")),
        "tpot_ms": _percentiles(tpot, ("p50", "p90", "p99")),
        "e2e_ms": _percentiles(e2e, ("p50", "p99")),
        "prefix_hit_rate": _ratio(
            sum(o.cached_tokens for o in done), sum(o.prompt_tokens for o in done)
        ),
        "goodput": goodput_by_slo[slo_key(slos[0])],
        "completed": len(done),
        "errors": len(outcomes) - len(done),
        "cross_region_share": _ratio(cross, len(located)),
        "imbalance": float(imbalance),
        "decision_us": _percentiles(decision, ("p50", "p99")),
        "goodput_by_slo": goodput_by_slo,
    }
    if errors:
        point["prediction_ape"] = _percentiles(errors, ("p50", "p90"))
    if seed is not None:
        point["seed"] = seed
    if floor_ttft_ms is not None:
        floor = _percentiles(list(floor_ttft_ms), ("p50", "p90", "p99"))
        point["floor_ttft_ms"] = floor
        point["ttft_vs_floor"] = {
            q: None if (arm_q := point["ttft_ms"][q]) is None or not floor[q] else arm_q / floor[q]
            for q in ("p50", "p90")
        }
    if duration_s is not None:
        point["duration_s"] = float(duration_s)
        point["throughput_rps"] = len(done) / duration_s
        point["output_tokens_per_s"] = sum(o.output_tokens for o in done) / duration_s
    return point


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``/proc/cpuinfo``), or ``"unknown"``; for a report's meta."""
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "unknown"


def run_header() -> dict[str, Any]:
    """The head of a small tool's stored report: the command as typed (``firstlight bench
    TOOL ...``, :func:`~firstlight_bench.options.command_line`), the commit
    (:func:`git_commit`), the time and the machine."""
    from firstlight_bench.options import command_line

    return {
        "command": command_line(),
        "git_commit": git_commit(),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
    }


def read_report(out: Path) -> dict[str, Any]:
    """The report a tool stored in ``out/results.json`` (for ``--tables-only``)."""
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    return data


def short_commit(commit: str) -> str:
    """A report's commit for a table heading: 12 hex digits, and a word when the tree
    had uncommitted changes (``git_commit``'s ``-dirty``)."""
    dirty = commit.endswith("-dirty")
    return commit.removesuffix("-dirty")[:12] + (" + uncommitted changes" if dirty else "")


def git_commit(repo: Path | None = None) -> str:
    """``HEAD``'s commit of the checkout at ``repo`` (default: the current directory),
    with ``-dirty`` appended when ``git status --porcelain`` lists anything; ``"unknown"``
    outside a git checkout or without git. Called when a run writes its ``meta``."""
    cwd = None if repo is None else str(repo)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain"))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit
