"""Engine benchmark: cold vs cached-prefix TTFT, decode speed, start-up, peak memory.

Run ``firstlight bench engine --engine vllm`` (the default model on vLLM, CPU or GPU) or
``--engine sim`` (the simulator's ``cpu-smollm2-135m`` profile, in real time, to see how
closely it tracks the real engine); other options: ``--config FILE --dtype
auto|float32|bfloat16|float16 --seed 0`` and those below. Prints JSON:

* ``ttft_ms.cold`` / ``ttft_ms.cached``: median (and p90) time to the first chunk of a
  ``--prompt-tokens`` prompt, with nothing cached vs with its first ``--cached-tokens``
  already in the prefix cache (``--repeats`` each); ``cached_over_cold`` is their ratio;
* ``decode``: ``--concurrency`` requests of ``--output-tokens`` greedy tokens at once:
  tokens/s per request and in total;
* ``startup_s`` and ``peak_rss_mib`` (this process and its children, e.g. vLLM's engine
  core; sampled every 50 ms);
* ``idle_cpu_cores``: after that burst, the CPU the engine's own processes (the
  children that appeared while it started) use in each window while no request
  comes: 0-1 s, 1-2 s, 2-5 s (cores: CPU seconds per wall second). ``--page PAGE``
  rewrites that page's ``engine-idle`` section from the report (:func:`render_idle`; a test holds
  ``docs/serving.md`` to the stored ``docs/benchmarks/engine-idle/results.json``).

vLLM logs to stdout, so use ``--out FILE`` (a file here, not a folder) for a clean copy
of the report.

The engine builds its process with ``spawn``: run the benchmark as ``firstlight bench
engine`` (a spawned process re-imports the main module, which must not start it again).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import psutil
import typer

from firstlight.config import HintsConfig, ModelConfig, load_config
from firstlight.engine.protocol import Engine, GenerationRequest, SamplingSettings
from firstlight.prefix import HashScheme
from firstlight.quantiles import percentile
from firstlight_bench.options import (
    EngineKind,
    PageOption,
    SeedOption,
    command_line,
    page_needs_out,
)
from firstlight_bench.reports.results import cpu_model, git_commit
from firstlight_bench.reports.sections import replace_tables

__all__ = ["IDLE_BEGIN", "IDLE_END", "app", "emit", "render_idle"]

IDLE_BEGIN = (
    "<!-- engine-idle:begin (generated from docs/benchmarks/engine-idle/results.json; "
    "do not edit) -->"
)
IDLE_END = "<!-- engine-idle:end -->"
_IDLE_WINDOWS_S = (1.0, 2.0, 5.0)

_VOCAB = (1000, 40_000)
"""Token ids drawn for synthetic prompts (ordinary vocabulary of the default model)."""


class _PeakMemory:
    """Samples the RSS of this process and its children in a background thread."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.05):
            total = 0
            for process in [me, *me.children(recursive=True)]:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    continue
            self.peak_bytes = max(self.peak_bytes, total)


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randint(*_VOCAB) for _ in range(n))


async def _ttft_ms(engine: Engine, request: GenerationRequest) -> float:
    start = time.perf_counter()
    first: float | None = None
    async for _chunk in engine.generate(request):
        if first is None:
            first = time.perf_counter()
    assert first is not None
    return (first - start) * 1000


def chat_prompts(model_dir: Path, questions: Sequence[str]) -> list[tuple[int, ...]]:
    """Each question as a one-message chat, templated and tokenized as the gateway does
    it (:class:`~firstlight.api.prompts.HfPromptEncoder`)."""
    from firstlight.api.prompts import HfPromptEncoder
    from firstlight.api.schemas import ChatMessage

    encoder = HfPromptEncoder(model_dir)
    return [encoder.chat([ChatMessage(role="user", content=q)]) for q in questions]


def _summary(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p50, p90 = (percentile(ordered, q) or 0.0 for q in (0.5, 0.9))
    return {"p50": round(p50, 1), "p90": round(p90, 1)}


class Dtype(StrEnum):
    """The model's dtype, as the configuration names it."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


@dataclass(frozen=True, slots=True)
class _Options:
    """The options a run measured with, as its report's ``meta.options`` records them
    (``docs/engines.md``'s table compares two runs' options)."""

    engine: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    concurrency: int
    repeats: int
    seed: int
    dtype: str | None


async def _measure(engine: Engine, engine_pids: set[int], args: _Options) -> dict[str, Any]:
    rng = random.Random(args.seed)
    one = SamplingSettings(max_tokens=1)
    warm_up = GenerationRequest("warm-up", _tokens(rng, 64), one)
    await _ttft_ms(engine, warm_up)
    cold, cached = [], []
    prefix = _tokens(rng, args.cached_tokens)
    await _ttft_ms(engine, GenerationRequest("prefix", prefix, one))
    suffix_len = args.prompt_tokens - args.cached_tokens
    for i in range(args.repeats):
        fresh = _tokens(rng, args.prompt_tokens)
        cold.append(await _ttft_ms(engine, GenerationRequest(f"cold-{i}", fresh, one)))
        warm = prefix + _tokens(rng, suffix_len)
        cached.append(await _ttft_ms(engine, GenerationRequest(f"cached-{i}", warm, one)))
    decode = SamplingSettings(max_tokens=args.output_tokens)

    async def one_stream(i: int) -> int:
        request = GenerationRequest(f"decode-{i}", _tokens(rng, 64), decode)
        return sum([len(c.token_ids) async for c in engine.generate(request)])

    start = time.perf_counter()
    produced = await asyncio.gather(*(one_stream(i) for i in range(args.concurrency)))
    elapsed = time.perf_counter() - start
    idle = await _idle_cpu_cores(engine_pids)
    cold_s, cached_s = _summary(cold), _summary(cached)
    return {
        "ttft_ms": {
            "cold": cold_s,
            "cached": cached_s,
            "cached_over_cold": round(cached_s["p50"] / cold_s["p50"], 3),
        },
        "decode": {
            "concurrency": args.concurrency,
            "tokens": sum(produced),
            "tokens_per_s_total": round(sum(produced) / elapsed, 1),
            "tokens_per_s_per_request": round(sum(produced) / elapsed / args.concurrency, 1),
        },
        "idle_cpu_cores": idle,
    }


def _child_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _cpu_s(pids: set[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


async def _idle_cpu_cores(engine_pids: set[int]) -> dict[str, float]:
    """CPU cores the engine's processes (``engine_pids``: the children that appeared
    while it started) used in each window after the last request ended (the windows end
    at :data:`_IDLE_WINDOWS_S`)."""
    loop = asyncio.get_running_loop()
    start = last_at = loop.time()
    last_cpu = _cpu_s(engine_pids)
    cores: dict[str, float] = {}
    begin = 0.0
    for end in _IDLE_WINDOWS_S:
        await asyncio.sleep(start + end - loop.time())  # the window itself, not a wait
        now, used = loop.time(), _cpu_s(engine_pids)
        cores[f"{begin:g}-{end:g}s"] = round((used - last_cpu) / (now - last_at), 3)
        begin, last_at, last_cpu = end, now, used
    return cores


def render_idle(report: dict[str, Any]) -> str:
    """The ``engine-idle`` section of ``docs/serving.md``: the engine's CPU after a
    burst, per window, headed by how it was measured."""
    from firstlight_bench.reports.results import short_commit

    meta = report["meta"]
    windows = report["idle_cpu_cores"]
    lines = [
        IDLE_BEGIN,
        "",
        f"`{meta['command']}` at commit `{short_commit(meta['git_commit'])}` "
        f"({meta['engine']}, {meta['model']}, {meta['cpu_count']} cores): CPU used by the "
        f"engine's processes after {meta['options']['concurrency']} concurrent requests "
        "ended, in cores (CPU seconds per second):",
        "",
        "| " + " | ".join(f"{w} after the burst" for w in windows) + " |",
        "|" + "---:|" * len(windows),
        "| " + " | ".join(f"{v:.2f}" for v in windows.values()) + " |",
        "",
        IDLE_END,
    ]
    return "\n".join(lines)


def _build(kind: str, model: ModelConfig, model_dir: Path, scheme: HashScheme) -> Engine:
    if kind == "vllm":
        from firstlight.engine.vllm_engine import VllmEngine

        return VllmEngine.create(model, model_dir, scheme)
    from firstlight.engine.sim import SimEngine

    return SimEngine.for_profile("cpu-smollm2-135m", model_name=model.name, scheme=scheme)


app = typer.Typer(add_completion=False)


@app.command()
def engine(
    kind: Annotated[
        EngineKind, typer.Option("--engine", help="vLLM, or the simulator in real time.")
    ] = EngineKind.VLLM,
    config: Annotated[Path | None, typer.Option(help="Configuration (default: built-in).")] = None,
    prompt_tokens: Annotated[int, typer.Option(min=1, help="Tokens of each TTFT prompt.")] = 1000,
    cached_tokens: Annotated[
        int, typer.Option(min=1, help="Of them, already in the prefix cache (cached TTFT).")
    ] = 900,
    output_tokens: Annotated[int, typer.Option(min=1, help="Tokens per decode request.")] = 64,
    concurrency: Annotated[int, typer.Option(min=1, help="Decode requests at once.")] = 4,
    repeats: Annotated[int, typer.Option(min=1, help="TTFT samples, cold and cached.")] = 10,
    seed: SeedOption = 0,
    dtype: Annotated[
        Dtype | None,
        typer.Option(
            help="The model's dtype (default: the configuration's; the local platform runs "
            "the default model in float32, as bfloat16 answers garbage on CPUs with AMX)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Also write the JSON report to this file.")
    ] = None,
    page: PageOption = None,
) -> None:
    """Engine benchmark: cold vs cached-prefix TTFT, decode speed, start-up, peak memory
    and idle CPU. Prints the JSON report, writes it to --out and rewrites --page's
    engine-idle section. Run as firstlight bench engine (the module's docstring says
    what each figure is)."""
    page_needs_out(out, page)
    if cached_tokens > prompt_tokens:
        raise typer.BadParameter(
            f"{cached_tokens} is more than --prompt-tokens {prompt_tokens}",
            param_hint="--cached-tokens",
        )
    args = _Options(
        kind.value, prompt_tokens, cached_tokens, output_tokens, concurrency, repeats, seed,
        None if dtype is None else dtype.value,
    )  # fmt: skip
    loaded = load_config(config)
    update: dict[str, Any] = {"kv_cache_gib": loaded.models[0].kv_cache_gib or 1}
    if args.dtype is not None:
        update["dtype"] = args.dtype
    model = loaded.models[0].model_copy(update=update)
    scheme = HashScheme.for_model(model, loaded.hints if config else HintsConfig())
    with _PeakMemory() as memory:
        before = _child_pids()
        start = time.perf_counter()
        built = _build(args.engine, model, loaded.model_dir(model), scheme)
        startup_s = time.perf_counter() - start
        engine_pids = _child_pids() - before

        async def run() -> dict[str, Any]:
            try:
                return await _measure(built, engine_pids, args)
            finally:
                await built.shutdown()

        measured = asyncio.run(run())
    report = {
        "meta": {
            "command": command_line(),
            "git_commit": git_commit(),
            "engine": args.engine,
            "simulated": built.simulated,
            "model": model.name,
            "python": sys.version.split()[0],
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "options": asdict(args),
        },
        "startup_s": round(startup_s, 1),
        "peak_rss_mib": round(memory.peak_bytes / 2**20),
        **measured,
    }
    emit(report, out)
    if page is not None:
        section = render_idle(report)
        page.write_text(replace_tables(page.read_text(), section, begin=IDLE_BEGIN, end=IDLE_END))


def emit(report: dict[str, Any], out: Path | None) -> dict[str, Any]:
    """Print a benchmark's JSON report (and write it to ``out``); return it."""
    text = json.dumps(report, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    typer.echo(text)
    return report
