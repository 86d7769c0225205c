"""The prefix-cache advisor's ledger: per caller group and model, how much of the prompt
was served from cache, why the rest was not, and what a fix would save.

Each request a gateway served in its region becomes one :class:`PromptSample`. The
ledger sorts the tokens that were computed again although this gateway had seen them
before into causes, each a :class:`Finding` priced in milliseconds per token (below):

``variable_prefix``
    The prompt's first blocks differ from every earlier prompt, but a run of its later
    content recurs (:mod:`firstlight.advisor.chunks` finds it wherever it sits): a date,
    a name or a request id before a static system prompt. vLLM's prefix cache is chained,
    so none of that run can hit. Moving the variable part after the static run would let
    the run be served from cache: the finding's tokens are the run's.
``evicted``
    The leading blocks were computed for an earlier request here, but no replica held
    them any more when this one was routed (the hints said so): evicted before reuse.
``held_elsewhere``
    A replica held them, but the router chose another one (its predicted time to first
    token was lower, queueing included): a routing trade, not the client's to fix.
``not_reused``
    Seen before but not served from cache, where the routing policy does not say which
    replica held what (the baselines).

The row also gives the median of the leading tokens prompts share with earlier ones
(``shared_prefix_tokens_p50``) and the price of 100 prefill tokens, which is what
shortening a system prompt saves on each miss.

The price of a token is *measured* where the requests allow it: per model, the slope of
the observed time to first token over the uncached prompt tokens of the last
``fit_samples`` requests served here (least squares), once they number at least
``_FIT_MIN_SAMPLES`` and their uncached tokens spread by at least ``_FIT_MIN_SPREAD``
(standard deviation) — what one more computed token has cost here, contention included.
Otherwise it is the cost model's calibrated rate (the chosen replica's ``prefill_ms /
uncached_tokens``, averaged over the row), else ``default_ms_per_token``. Each row says
which (``price_source``).

Who calls what: :class:`~firstlight.telemetry.GatewayTelemetry` owns one
:class:`PrefixAdvisor`, calls :meth:`PrefixAdvisor.observe` once per successful request
served here (at its end), and the dashboard and ``GET /v1/firstlight/advisor`` read
:meth:`PrefixAdvisor.report`. Pure and synchronous; memory is bounded (LRU sets of block
hashes and chunk digests, a bounded number of groups).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from typing import Literal

from firstlight.advisor.chunks import Chunk, content_chunks

__all__ = [
    "FINDING_KINDS",
    "AdvisorRow",
    "Finding",
    "FindingKind",
    "PrefixAdvisor",
    "PriceSource",
    "PromptSample",
]

FindingKind = Literal["variable_prefix", "evicted", "held_elsewhere", "not_reused"]
PriceSource = Literal["measured", "cost_model", "default"]
FINDING_KINDS: tuple[FindingKind, ...] = (
    "variable_prefix",
    "evicted",
    "held_elsewhere",
    "not_reused",
)

OTHER_GROUP = "(other)"
"""Where samples of groups beyond ``max_groups`` are counted."""

_ADVICE: dict[FindingKind, str] = {
    "variable_prefix": (
        "prompts differ in their first blocks but repeat later content: move the part "
        "that changes (date, name, id) after the static part"
    ),
    "evicted": (
        "prefixes were evicted before reuse: more KV cache per replica, more replicas, "
        "or fewer distinct prefixes"
    ),
    "held_elsewhere": (
        "a replica held the prefix but was busier: the router traded the cache hit for "
        "a shorter queue"
    ),
    "not_reused": (
        "seen before but not served from cache (the routing policy does not say where "
        "the prefix was held)"
    ),
}
_RECENT = 256
_FIT_MIN_SAMPLES = 8
_FIT_MIN_SPREAD = 32.0
"""Uncached tokens' standard deviation below which the slope is noise, tokens."""


@dataclass(frozen=True, slots=True)
class PromptSample:
    """One request served in this region, as its gateway saw it."""

    group: str
    """Who sent it: the tenant's name, else the API key's id, else ``anonymous``."""
    model: str
    token_ids: tuple[int, ...]
    """The prompt after the chat template (empty: content analysis skipped)."""
    block_hashes: tuple[int, ...]
    """Hint-form hashes of its full blocks (:func:`firstlight.prefix.hint_hashes`)."""
    block_size: int
    prompt_tokens: int
    cached_tokens: int
    """Served from the prefix cache: the engine's usage, else the router's prediction."""
    held_tokens: int | None
    """The longest prefix any candidate replica held when it was routed (the cost
    model's hint lookup); ``None`` where the policy does not tell."""
    ms_per_token: float | None
    """The chosen replica's calibrated prefill cost, ms per token; ``None``: unknown."""
    ttft_ms: float | None = None
    """The time to first token observed at the gateway (the measured price's data)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One cause of recomputed prompt tokens in a row, and what fixing it would save."""

    kind: FindingKind
    requests: int
    """Requests it affected."""
    tokens_per_request: float
    """Prompt tokens a fix would serve from cache, averaged over the row's requests."""
    saving_ms_per_request: float
    """Those tokens at the row's prefill cost: time to first token saved per request."""
    advice: str
    diverge_at_token: int | None = None
    """``variable_prefix``: median token offset where prompts stop matching earlier ones."""
    agree_from_token: int | None = None
    """``variable_prefix``: median token offset where the repeated content begins."""


@dataclass(frozen=True, slots=True)
class AdvisorRow:
    """One caller group's use of one model's prefix cache at this gateway."""

    group: str
    model: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    cached_share: float
    """Share of prompt tokens served from cache."""
    shared_prefix_tokens_p50: int
    """Median number of leading tokens a prompt shares with an earlier one."""
    prefill_ms_per_100_tokens: float
    """The price of 100 uncached prompt tokens here (what a shorter prompt saves)."""
    price_source: PriceSource
    """Where the price comes from: ``measured`` (the slope of observed TTFT over uncached
    tokens for this model), ``cost_model`` (the replicas' calibrated prefill rate) or
    ``default``."""
    cost_model_ms_per_100_tokens: float | None
    """The cost model's calibrated price of 100 uncached tokens for this row's requests
    (what the router predicts with), whatever the source of the price above; ``None``
    while no routed request said."""
    findings: tuple[Finding, ...]
    """Causes worth fixing (at least ``min_share`` of the prompt tokens), largest first."""

    def to_json(self) -> dict[str, object]:
        """The row as JSON (``GET /v1/firstlight/advisor`` and the dashboard)."""
        out = asdict(self)
        out["findings"] = [asdict(f) for f in self.findings]
        return out


@dataclass
class _Row:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tokens: dict[FindingKind, int] = field(default_factory=lambda: dict.fromkeys(FINDING_KINDS, 0))
    affected: dict[FindingKind, int] = field(
        default_factory=lambda: dict.fromkeys(FINDING_KINDS, 0)
    )
    chunks: OrderedDict[int, None] = field(default_factory=OrderedDict)
    shared_prefix: deque[int] = field(default_factory=lambda: deque(maxlen=_RECENT))
    diverge_at: deque[int] = field(default_factory=lambda: deque(maxlen=_RECENT))
    agree_from: deque[int] = field(default_factory=lambda: deque(maxlen=_RECENT))
    ms_per_token: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))


class PrefixAdvisor:
    """The ledger of one gateway (see the module docstring).

    ``default_ms_per_token`` prices tokens until a replica's calibrated rate is seen;
    ``min_share``: a cause is reported once its tokens reach this share of the row's
    prompt tokens."""

    def __init__(
        self,
        default_ms_per_token: float,
        *,
        min_share: float = 0.05,
        max_groups: int = 256,
        chunk_memory: int = 8192,
        block_memory: int = 65536,
        fit_samples: int = _RECENT,
    ) -> None:
        if default_ms_per_token <= 0:
            raise ValueError(f"default_ms_per_token = {default_ms_per_token!r}: must be > 0")
        self._default_ms = default_ms_per_token
        self._min_share = min_share
        self._max_groups = max_groups
        self._chunk_memory = chunk_memory
        self._block_memory = block_memory
        self._rows: dict[tuple[str, str], _Row] = {}
        self._blocks: dict[str, OrderedDict[int, None]] = {}
        self._fit_samples = fit_samples
        self._timings: dict[str, deque[tuple[int, float]]] = {}

    def observe(self, sample: PromptSample) -> None:
        """Account for one served request, then remember its blocks and chunks."""
        row = self._row(sample.group, sample.model)
        blocks = self._blocks.setdefault(sample.model, OrderedDict())
        size = sample.block_size
        seen_blocks = 0
        for block in sample.block_hashes:
            if block not in blocks:
                break
            seen_blocks += 1
        seen = min(seen_blocks * size, sample.prompt_tokens)
        cached = min(sample.cached_tokens, sample.prompt_tokens)
        row.requests += 1
        row.prompt_tokens += sample.prompt_tokens
        row.cached_tokens += cached
        row.shared_prefix.append(seen)
        if sample.ms_per_token is not None and sample.ms_per_token > 0:
            row.ms_per_token.append(sample.ms_per_token)
        if sample.ttft_ms is not None:
            timings = self._timings.setdefault(sample.model, deque(maxlen=self._fit_samples))
            timings.append((sample.prompt_tokens - cached, sample.ttft_ms))
        # Seen here before, yet computed again: why.
        if sample.held_tokens is None:
            self._count(row, "not_reused", seen - cached)
        else:
            held = sample.held_tokens
            self._count(row, "held_elsewhere", min(held, seen) - cached)
            self._count(row, "evicted", seen - max(held, cached))
        chunks = content_chunks(sample.token_ids) if sample.token_ids else ()
        run = _longest_seen_run(chunks, row.chunks, after=max(seen, cached))
        if run is not None and run[1] - run[0] >= size:
            self._count(row, "variable_prefix", run[1] - run[0])
            row.diverge_at.append(max(seen, cached))
            row.agree_from.append(run[0])
        for block in sample.block_hashes:
            _remember(blocks, block, self._block_memory)
        for chunk in chunks:
            _remember(row.chunks, chunk.digest, self._chunk_memory)

    def report(self) -> tuple[AdvisorRow, ...]:
        """Every row, the one with most to recover per request first."""
        rows = [self._report_row(group, model, row) for (group, model), row in self._rows.items()]
        rows.sort(key=lambda r: (-sum(f.saving_ms_per_request for f in r.findings), r.group))
        return tuple(rows)

    # --- helpers ----------------------------------------------------------------------

    def _row(self, group: str, model: str) -> _Row:
        key = (group, model)
        if key not in self._rows and len(self._rows) >= self._max_groups:
            key = (OTHER_GROUP, model)
        return self._rows.setdefault(key, _Row())

    @staticmethod
    def _count(row: _Row, kind: FindingKind, tokens: int) -> None:
        if tokens > 0:
            row.tokens[kind] += tokens
            row.affected[kind] += 1

    def price(self, model: str) -> tuple[float | None, int]:
        """The measured price of one uncached prompt token of ``model`` (ms; ``None``
        while the requests do not allow a fit: see the module docstring) and the number
        of requests it was fitted on."""
        timings = self._timings.get(model, ())
        if len(timings) < _FIT_MIN_SAMPLES:
            return None, len(timings)
        xs = [float(x) for x, _ in timings]
        ys = [y for _, y in timings]
        if statistics.pstdev(xs) < _FIT_MIN_SPREAD:
            return None, len(timings)
        slope = statistics.linear_regression(xs, ys).slope
        return (slope if slope > 0 else None), len(timings)

    def _report_row(self, group: str, model: str, row: _Row) -> AdvisorRow:
        measured, _ = self.price(model)
        source: PriceSource
        if measured is not None:
            ms, source = measured, "measured"
        elif row.ms_per_token:
            ms, source = statistics.fmean(row.ms_per_token), "cost_model"
        else:
            ms, source = self._default_ms, "default"
        modelled = statistics.fmean(row.ms_per_token) if row.ms_per_token else None
        findings = []
        for kind in FINDING_KINDS:
            tokens = row.tokens[kind]
            if tokens == 0 or tokens < self._min_share * row.prompt_tokens:
                continue
            per_request = tokens / row.requests
            variable = kind == "variable_prefix"
            findings.append(
                Finding(
                    kind=kind,
                    requests=row.affected[kind],
                    tokens_per_request=round(per_request, 1),
                    saving_ms_per_request=round(per_request * ms, 2),
                    advice=_ADVICE[kind],
                    diverge_at_token=_median(row.diverge_at) if variable else None,
                    agree_from_token=_median(row.agree_from) if variable else None,
                )
            )
        findings.sort(key=lambda f: -f.saving_ms_per_request)
        return AdvisorRow(
            group=group,
            model=model,
            requests=row.requests,
            prompt_tokens=row.prompt_tokens,
            cached_tokens=row.cached_tokens,
            cached_share=round(row.cached_tokens / row.prompt_tokens, 4)
            if row.prompt_tokens
            else 0.0,
            shared_prefix_tokens_p50=_median(row.shared_prefix) or 0,
            prefill_ms_per_100_tokens=round(100 * ms, 2),
            price_source=source,
            cost_model_ms_per_100_tokens=None if modelled is None else round(100 * modelled, 2),
            findings=tuple(findings),
        )


def _longest_seen_run(
    chunks: tuple[Chunk, ...], seen: OrderedDict[int, None], *, after: int
) -> tuple[int, int] | None:
    """The longest run of consecutive chunks starting at or after token ``after`` whose
    content was seen before, as (start, end) token offsets; ``None`` if there is none."""
    best: tuple[int, int] | None = None
    start: int | None = None
    end = 0
    for chunk in chunks:
        if chunk.start < after:
            continue
        if chunk.digest in seen:
            if start is None:
                start = chunk.start
            end = chunk.end
            if best is None or end - start > best[1] - best[0]:
                best = (start, end)
        else:
            start = None
    return best


def _remember(memory: OrderedDict[int, None], key: int, limit: int) -> None:
    if key in memory:
        memory.move_to_end(key)
        return
    memory[key] = None
    if len(memory) > limit:
        memory.popitem(last=False)


def _median(values: deque[int]) -> int | None:
    return int(statistics.median(values)) if values else None
