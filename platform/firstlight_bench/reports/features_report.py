"""The records of ``firstlight bench features`` and the page section made from them.

Who calls what: :mod:`firstlight_bench.tools.features` builds a :class:`FeaturesReport` (one
:class:`ServerFeatures` per server, one :class:`FeatureResult` per feature), stores
:meth:`FeaturesReport.to_json` as ``OUT/results.json`` and renders :func:`render_markdown`
between :func:`markers` on a page (``docs/api.md``); ``--tables-only`` reads the stored
JSON back with :meth:`FeaturesReport.from_json`. The tests render canned reports.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = [
    "FEATURE_TITLES",
    "SERVER_LABELS",
    "FeatureResult",
    "FeaturesMeta",
    "FeaturesReport",
    "Outcome",
    "ServerFeatures",
    "markers",
    "render_markdown",
    "render_stored",
]

FEATURE_TITLES: dict[str, str] = {
    "json_schema": "`response_format` `json_schema`",
    "json_object": "`response_format` `json_object` (JSON mode)",
    "tool_choice_named": "named `tool_choice` (one tool)",
    "logprobs": "`logprobs` + `top_logprobs=3`",
    "n": "`n=2`",
    "seed": "`seed` (temperature 1.0)",
    "stop": "`stop` strings",
    "min_tokens": "`min_tokens` (vLLM extra)",
    "sampling_extras": "penalties, `repetition_penalty`, `top_k`, `min_p`",
    "models_retrieve": "`GET /v1/models/{id}`",
    "logit_bias": "`logit_bias` (+100 on one token)",
    "echo": "completions with `echo=True`",
}
"""Every feature the command checks, in the table's order, with its row title."""

SERVER_LABELS: dict[str, str] = {
    "vllm_server": "raw vLLM server",
    "firstlight": "Firstlight",
}
"""Column titles for the servers the command starts itself (others keep their name)."""

Outcome = Literal["honoured", "accepted", "refused", "error"]


@dataclass(frozen=True)
class FeatureResult:
    """One feature on one server."""

    feature: str
    """A key of :data:`FEATURE_TITLES`."""
    accepted: bool
    """The request carrying the feature was answered without an error."""
    honoured: bool
    """The answer proves the field had its effect (each check's docstring says how)."""
    evidence: str
    """A few words: what the answer showed, or why nothing could be judged."""
    error: str | None = None
    """The error, when a request failed (the HTTP status and message, or the exception)."""
    http_status: int | None = None
    """The HTTP status of a failed request, when the server answered one."""

    @property
    def outcome(self) -> Outcome:
        """``refused``: a 4xx answer to the request carrying the feature; ``error``:
        anything else that failed (no answer, a 5xx, an inconclusive baseline)."""
        if self.honoured:
            return "honoured"
        if self.accepted:
            return "accepted"
        if self.http_status is not None and 400 <= self.http_status < 500:
            return "refused"
        return "error"


@dataclass(frozen=True)
class ServerFeatures:
    """Every feature's result on one server."""

    server: str
    base_url: str
    results: tuple[FeatureResult, ...]


@dataclass(frozen=True)
class FeaturesMeta:
    """How the run was made."""

    command: str
    git_commit: str
    created_at: str
    model: str
    openai_client: str
    """The official ``openai`` client's version."""
    vllm: str | None
    """vLLM's version in this environment (the raw server's), if installed."""
    python: str
    cpu_count: int | None
    cpu: str
    platform: str
    started: tuple[str, ...]
    """The servers this command started itself (``--arms``), in order."""


@dataclass(frozen=True)
class FeaturesReport:
    """A whole run: its meta and one :class:`ServerFeatures` per server."""

    meta: FeaturesMeta
    servers: tuple[ServerFeatures, ...]

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``results.json``)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FeaturesReport:
        """A report from :meth:`to_json`'s data; ``KeyError``/``TypeError`` when it is
        not one."""
        meta = dict(data["meta"])
        meta["started"] = tuple(meta["started"])
        servers = tuple(
            ServerFeatures(
                server=s["server"],
                base_url=s["base_url"],
                results=tuple(FeatureResult(**r) for r in s["results"]),
            )
            for s in data["servers"]
        )
        return cls(FeaturesMeta(**meta), servers)


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of run ``name``'s generated section on a page."""
    return (
        f"<!-- features:{name}:begin (generated from docs/benchmarks/{name}/results.json; "
        "do not edit) -->",
        f"<!-- features:{name}:end -->",
    )


_MARKDOWN_SPECIAL = "\\`*_[]<>|"


def _cell(text: str) -> str:
    flat = " ".join(text.split())
    return "".join(f"\\{c}" if c in _MARKDOWN_SPECIAL else c for c in flat)


def _verdict_cell(result: FeatureResult | None) -> str:
    if result is None:
        return "not checked"
    outcome = result.outcome
    detail = result.evidence if outcome in ("honoured", "accepted") else result.error or ""
    head = f"**{outcome}**" if outcome == "honoured" else outcome
    return f"{head}: {_cell(detail)}" if detail else head


def render_markdown(report: FeaturesReport, name: str) -> str:
    """Run ``name``'s section: how it was measured, then a row per feature and a column
    per server, each cell "honoured / accepted / refused / error" with its evidence.
    Called by ``firstlight bench features --page`` and ``--tables-only``, and by the
    tests."""
    from firstlight_bench.reports.results import short_commit

    meta = report.meta
    begin, end = markers(name)
    engine = f", vLLM {meta.vllm} on the CPU" if meta.vllm else ""
    lines = [
        begin,
        "",
        f"`{meta.command}` at commit `{short_commit(meta.git_commit)}`: model "
        f"`{meta.model}`{engine}, {meta.cpu_count} cores ({meta.cpu}); requests from the "
        f"official `openai` client {meta.openai_client}, greedy where the check allows. "
        "**honoured**: the answer proves the field had its effect; accepted: answered, "
        "the effect not shown; refused: a 4xx answer; error: anything else.",
        "",
    ]
    columns = [SERVER_LABELS.get(s.server, s.server) for s in report.servers]
    lines.append("| feature | " + " | ".join(_cell(c) for c in columns) + " |")
    lines.append("|---" * (len(columns) + 1) + "|")
    by_server = [{r.feature: r for r in s.results} for s in report.servers]
    checked = [f for f in FEATURE_TITLES if any(f in results for results in by_server)]
    for feature in checked:
        cells = [_verdict_cell(results.get(feature)) for results in by_server]
        lines.append(f"| {FEATURE_TITLES[feature]} | " + " | ".join(cells) + " |")
    counts = [f"{sum(r.honoured for r in s.results)} of {len(s.results)}" for s in report.servers]
    lines.append("| **honoured** | " + " | ".join(counts) + " |")
    lines += ["", end]
    return "\n".join(lines)


def render_stored(data: dict[str, Any], name: str) -> str:
    """:func:`render_markdown` of a stored ``results.json`` (the shape
    :func:`firstlight_bench.reports.sections.rewrite_sections` and ``store_section`` call)."""
    return render_markdown(FeaturesReport.from_json(data), name)
