"""The prefix-cache advisor checked against a measurement: does the saving it predicts for
a cache-hostile prompt match what moving the variable part to the end saves?

Run ``firstlight bench advisor`` (options ``--engine sim|vllm --requests 40 --seed 0
--cache-dir DIR --out FOLDER --page PAGE``, and ``--tables-only`` to re-render the page
from a stored report). One local region serves the default model with API keys of three
tenants (each tenant's requests carry their own cache salt, so no arm reuses another's
blocks):

* ``variable-first`` sends a system prompt that starts with a variable line (a request
  id, a date and a user name) followed by a static system prompt of some 600 tokens;
* ``static-first`` sends the same two parts the other way round;
* ``warmup`` sends one request before the rest, so no arm pays for the first one.

Each arm sends one request first (cached by nothing: not measured), then ``--requests``
more, interleaved (A B, B A, ...), sequential, streamed through the official ``openai``
client, greedy, one output token. Then it reads the advisor
(``GET /v1/firstlight/advisor`` with the variable-first tenant's key) and compares:

* predicted: the ``variable_prefix`` finding's saving per affected request
  (``saving_ms_per_request`` x the row's requests ÷ the finding's requests: the row's
  figure averages over the first request too, which nothing could have saved);
* measured: mean client-side TTFT of variable-first minus that of static-first.

The goal (issue 23) is a prediction within 20 % of the measurement. The static-first
tenant's row should have no ``variable_prefix`` finding; the report says whether it has.
With ``--engine sim`` the replicas are simulated (the default model's CPU profile, in
real time) and the report says so.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight._ports import free_port
from firstlight.config import DEFAULT_MODEL_NAME, PlatformConfig, parse_config
from firstlight_bench.options import (
    EngineKind,
    OutOption,
    PageOption,
    SeedOption,
    TablesOnlyOption,
    rewrote_tables,
)
from firstlight_bench.reports.results import Outcome, run_header, short_commit
from firstlight_bench.reports.sections import replace_tables
from firstlight_bench.tools.engine import emit

__all__ = ["ARMS", "Asked", "app", "markers", "prompts", "render", "static_prompt"]

_REGION = "advice"
ARMS = ("variable-first", "static-first")
_TENANTS = ("warmup", *ARMS)
_USER = "Reply with one word: yes."
_WORDS = [
    "answer",
    "support",
    "customer",
    "account",
    "billing",
    "policy",
    "refund",
    "order",
    "shipping",
    "product",
    "warranty",
    "invoice",
    "payment",
    "address",
    "delivery",
    "return",
    "exchange",
    "contact",
    "hours",
    "service",
    "escalate",
    "politely",
    "briefly",
    "clearly",
    "always",
    "never",
    "include",
    "cite",
    "summary",
    "steps",
]


def markers(simulated: bool) -> tuple[str, str]:
    """The page markers around a run's table: one pair per engine."""
    name = "advisor" if simulated else "advisor-vllm-cpu"
    return (
        f"<!-- {name}:begin (generated from docs/benchmarks/{name}/results.json; do not edit) -->",
        f"<!-- {name}:end -->",
    )


def static_prompt(seed: int, sentences: int = 40) -> str:
    """A support assistant's rules: ``sentences`` numbered lines of plain words (about
    600 tokens of the default model's tokenizer at 40)."""
    rng = random.Random(seed)
    lines = [
        f"Rule {i + 1}: " + " ".join(rng.choice(_WORDS) for _ in range(10)) + "."
        for i in range(sentences)
    ]
    return "You are the support assistant of an online shop.\n" + "\n".join(lines)


def prompts(arm: str, index: int, static: str) -> list[dict[str, str]]:
    """The messages of request ``index`` of ``arm``: the variable line before or after
    the static prompt."""
    day = 1 + index % 28
    variable = f"Request {index:05d}-{index * 7919 % 100000:05d}, 2026-11-{day:02d}, user u{index}."
    system = f"{variable}\n{static}" if arm == "variable-first" else f"{static}\n{variable}"
    return [{"role": "system", "content": system}, {"role": "user", "content": _USER}]


@dataclass(frozen=True, slots=True)
class Asked:
    """One measured request: its arm and number, and what its client saw."""

    arm: str
    index: int
    outcome: Outcome

    def row(self) -> dict[str, Any]:
        """Its row of the stored report's ``asked`` (the keys stored reports have)."""
        o = self.outcome
        tokens = {"prompt_tokens": o.prompt_tokens, "cached_tokens": o.cached_tokens}
        return {"arm": self.arm, "index": self.index, **tokens, "ttft_ms": o.ttft_ms}


def _config(
    engine: str, port: int, keys: dict[str, Path], cache_dir: Path | None
) -> PlatformConfig:
    model: dict[str, Any] = {
        "name": DEFAULT_MODEL_NAME,
        "engine": engine,
        "replicas": 1,
        "resources": {"num_cpus": 0},
    }
    if engine == "vllm":
        model.update({"dtype": "float32", "kv_cache_gib": 1})
    else:  # simulated models count one token per byte: the static prompt is ~3,600
        model["max_model_len"] = 8192
    data: dict[str, Any] = {
        "mode": "local",
        "regions": [{"name": _REGION, "peers": []}],
        "models": [model],
        "auth": {
            "enabled": True,
            "api_keys": [{"file": str(path), "tenant": t} for t, path in keys.items()],
        },
        "gateway": {"host": "127.0.0.1", "port": port},
        "hints": {"key_prefix": "firstlight:advisor:"},
    }
    if cache_dir is not None:
        data["cache_dir"] = str(cache_dir)
    return parse_config(data, "firstlight bench advisor")


def _ask(client: Any, arm: str, index: int, static: str) -> Asked:
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=prompts(arm, index, static),
        temperature=0,
        max_tokens=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    first: float | None = None
    usage = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
    end = time.perf_counter()
    if first is None or usage is None:
        raise RuntimeError(f"{arm} request {index}: no text or no usage in the stream")
    details = usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None and details.cached_tokens else 0
    outcome = Outcome(
        f"{arm}-{index}", started, first, end, usage.prompt_tokens, usage.completion_tokens, cached
    )
    return Asked(arm, index, outcome)


def _advice(endpoint: str, key: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(
        f"{endpoint}/v1/firstlight/advisor", headers={"authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        rows: list[dict[str, Any]] = json.load(response)["data"]
    return rows


def _measure(endpoint: str, keys: dict[str, str], seed: int, requests: int) -> dict[str, Any]:
    import openai

    static = static_prompt(seed)
    clients = {
        t: openai.OpenAI(base_url=f"{endpoint}/v1", api_key=keys[t], max_retries=0)
        for t in _TENANTS
    }
    try:
        _ask(clients["warmup"], "static-first", 0, static_prompt(seed + 1))
        for arm in ARMS:  # each arm's first request: a miss whatever the order
            _ask(clients[arm], arm, 0, static)
        asked = []
        for i in range(1, requests + 1):
            for arm in ARMS if i % 2 else ARMS[::-1]:
                asked.append(_ask(clients[arm], arm, i, static))
    finally:
        for client in clients.values():
            client.close()
    rows = {arm: _advice(endpoint, keys[arm]) for arm in ARMS}
    return {"asked": asked, "rows": rows}


def summarize(asked: Sequence[Asked], rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The comparison of the report (see the module docstring)."""
    arms: dict[str, dict[str, float]] = {}
    for arm in ARMS:
        mine = [a.outcome for a in asked if a.arm == arm]
        ttfts = [ms for o in mine if (ms := o.ttft_ms) is not None]
        arms[arm] = {
            "requests": len(mine),
            "prompt_tokens_mean": statistics.fmean(o.prompt_tokens for o in mine),
            "cached_tokens_mean": statistics.fmean(o.cached_tokens for o in mine),
            "ttft_mean_ms": statistics.fmean(ttfts),
            "ttft_p50_ms": statistics.median(ttfts),
        }
    (row,) = rows["variable-first"]
    found = [f for f in row["findings"] if f["kind"] == "variable_prefix"]
    predicted = tokens = None
    if found:
        finding = found[0]
        scale = row["requests"] / finding["requests"]
        predicted = finding["saving_ms_per_request"] * scale
        tokens = finding["tokens_per_request"] * scale
    measured = arms["variable-first"]["ttft_mean_ms"] - arms["static-first"]["ttft_mean_ms"]
    modelled = row.get("cost_model_ms_per_100_tokens")
    at_cost_model = tokens * modelled / 100 if tokens is not None and modelled else None
    (control,) = rows["static-first"]
    return {
        "arms": arms,
        "advisor_row": row,
        "static_first_row": control,
        "predicted_tokens": tokens,
        "predicted_saving_ms": predicted,
        "measured_saving_ms": measured,
        "relative_error": abs(predicted - measured) / measured
        if predicted is not None and measured > 0
        else None,
        "static_first_flagged": any(f["kind"] == "variable_prefix" for f in control["findings"]),
        "cost_model_saving_ms": at_cost_model,
        "cost_model_relative_error": abs(at_cost_model - measured) / measured
        if at_cost_model is not None and measured > 0
        else None,
    }


def render(report: dict[str, Any]) -> str:
    """The docs' table of a stored report."""
    begin, end = markers(report["simulated"])
    arms = report["arms"]
    engine = (
        "simulated replicas (the default model's CPU profile)"
        if report["simulated"]
        else ("the default model on vLLM-CPU")
    )
    lines = [
        begin,
        "",
        f"Measured at {short_commit(report['git_commit'])} (`{report['command']}`): one local "
        f"region, {engine}, {report['requests']} requests per arm after one unmeasured "
        "request each, sequential, one output token.",
        "",
        "| arm | prompt tokens | served from cache | TTFT mean | TTFT p50 |",
        "|---|---|---|---|---|",
    ]
    for arm in ARMS:
        a = arms[arm]
        lines.append(
            f"| {arm} | {a['prompt_tokens_mean']:.0f} | {a['cached_tokens_mean']:.0f} "
            f"| {a['ttft_mean_ms']:.1f} ms | {a['ttft_p50_ms']:.1f} ms |"
        )
    lines.append("")
    if report["predicted_saving_ms"] is None:
        lines.append(
            "The advisor reported no `variable_prefix` finding for the variable-first arm."
        )
    else:
        error = report["relative_error"]
        verdict = "within" if error is not None and error <= 0.2 else "outside"
        lines.append(
            f"The advisor's `variable_prefix` finding for the variable-first arm: "
            f"{report['predicted_tokens']:.0f} tokens per request would be served from cache, "
            f"saving {report['predicted_saving_ms']:.1f} ms (at "
            f"{report['advisor_row']['prefill_ms_per_100_tokens']:.1f} ms per 100 tokens, "
            f"{_SOURCES[report['advisor_row'].get('price_source', 'cost_model')]}); "
            "moving the variable line to the "
            f"end measured {report['measured_saving_ms']:.1f} ms saved (mean TTFT "
            f"difference): an error of {_percent(error)}, {verdict} the 20 % goal."
        )
    if report.get("cost_model_saving_ms") is not None:
        lines.append(
            f"Priced at the cost model's rate instead "
            f"({report['advisor_row']['cost_model_ms_per_100_tokens']:.1f} ms per 100 tokens, "
            f"what the router predicts with), the same tokens would save "
            f"{report['cost_model_saving_ms']:.1f} ms: an error of "
            f"{_percent(report['cost_model_relative_error'])}."
        )
    flagged = "flagged it (a false finding)" if report["static_first_flagged"] else "had none"
    lines += [f"For the static-first arm the advisor {flagged}.", "", end]
    return "\n".join(lines)


_SOURCES = {
    "measured": "the slope of the TTFT the gateway observed over uncached tokens",
    "cost_model": "the cost model's calibrated prefill rate",
    "default": "the cost model's default prefill rate",
}


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


app = typer.Typer(add_completion=False)


@app.command()
def advisor(
    engine: Annotated[EngineKind, typer.Option(help="What serves the model.")] = EngineKind.SIM,
    requests: Annotated[int, typer.Option(min=2, help="Measured requests per arm.")] = 40,
    seed: SeedOption = 0,
    cache_dir: Annotated[Path | None, typer.Option(help="Folder of prepared models.")] = None,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: TablesOnlyOption = False,
) -> None:
    """The advisor's predicted saving against the measured one, on one local region: prints
    the JSON report and the page's table, stores it with --out, rewrites --page's table.
    Run by a maintainer to refresh docs/prefix-advisor.md."""
    if rewrote_tables(out, page, tables_only, _rewrite):
        return
    import ray

    from firstlight.serve.local_mode import start_local, stop_local

    with tempfile.TemporaryDirectory(prefix="firstlight-advisor-") as folder:
        keys = {t: f"sk-{t}-{random.Random(t).getrandbits(64):016x}" for t in _TENANTS}
        files = {}
        for tenant, key in keys.items():
            files[tenant] = Path(folder) / tenant
            files[tenant].write_text(key)
        config = _config(engine.value, free_port(), files, cache_dir)
        running = start_local(config, timeout_s=600)
        try:
            measured = _measure(running.endpoints[_REGION], keys, seed, requests)
        finally:
            stop_local(running)
            ray.shutdown()
    report = {
        **run_header(),
        "simulated": engine is EngineKind.SIM,
        "requests": requests,
        **summarize(measured["asked"], measured["rows"]),
        "asked": [a.row() for a in measured["asked"]],
    }
    emit(report, out / "results.json" if out else None)
    typer.echo(render(report))
    if page is not None:
        _rewrite(page, report)


def _rewrite(page: Path, report: dict[str, Any]) -> None:
    begin, end = markers(report["simulated"])
    page.write_text(replace_tables(page.read_text(), render(report), begin=begin, end=end))
