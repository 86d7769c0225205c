"""Serving benchmark: what the platform adds over the engine, and what its gateways carry.

Run ``firstlight bench serving [--requests 200] [--concurrency 1,8,32] [--gateways 1,2]
[--kill on|off] [--prompt-tokens 128] [--max-tokens 8] [--duration 10] [--seed 0]
[--ingress haproxy|serve-proxy] [--throughput-optimized on|off] [--out FOLDER [--page
PAGE]]`` (:func:`serving`, the typer command of this module's ``app``). One local Ray
cluster (``num_cpus=2``), one region whose model runs the simulator's ``instant`` profile
(2 replicas, microsecond steps): **simulated engine, real platform** - the numbers are
the platform's own cost, and the report says ``"simulated_engine": true``.

1. Overhead: ``--requests`` sequential requests per path (after 20 warm-up ones), the
   same random token prompts on each (the HTTP paths take turns request by request, then
   ``port``, ``handle``, then ``direct``); TTFT (first chunk, or first SSE ``data:``
   event) and end-to-end, p50/p90/p99, timed by the caller:

   * ``direct``: a ``SimEngine`` (``instant``) in this process, no Ray;
   * ``port``: the replicas' own ports from this process, taking turns, as a gateway
     streams from them (:mod:`firstlight.serve.replica_port`): the data path's hop alone;
   * ``handle``: the model deployment's Ray handle from this process (Firstlight's
     request router then runs here): Ray routing and the replica hop, no gateway;
   * ``http_tokens``: streaming ``POST /v1/completions``, ``prompt`` as token ids
     (httpx, keep-alive): the ingress → gateway → the chosen replica's port (or its
     handle, with ``gateway.data_path: ray-handle``);
   * ``http_chat_text``: streaming chat completions, a text prompt as long once
     templated (the sim byte-level encoder, not a real tokenizer);
   * ``http_floor``: ``GET /healthz`` (proxy → gateway, no model call);
   * ``ray_serve_floor``: the ``http_tokens`` bodies to a bare Ray Serve app of the same
     shape (ingress → 2-replica deployment streaming ``max_tokens + 1`` items as SSE).

   ``added_ms`` subtracts percentiles (not a percentile of differences); ``target``
   checks an earlier issue's goal, ``http_tokens - direct`` p50 ≤ 3 ms (the page shows
   the current goals); ``decision_mean_us`` is the gateways' mean policy time per
   decision, from their ``/metrics`` histogram. The page splits ``http_tokens``'s TTFT
   p50 by hop (:func:`~firstlight_bench.reports.serving_markdown.hops`) and draws it (``hops.png``).
2. Capacity per gateway count (``--gateways 1,2``: ``gateway.replicas``), the region
   redeployed for each, in A B B A blocks: closed-loop clients at each ``--concurrency``
   for ``--duration`` s, and the cores each group of processes used meanwhile
   (:mod:`firstlight_bench.tools.serving_gateways`); ``capacity`` compares the most gateways'
   best requests/s with the fewest's against the issue's goal (at least 1.7 times).
3. With ``--kill on`` (the default), one of the most gateways is killed under steady
   load after its last block, and every failed request is counted (goal: none).

The overhead paths run on the deployment with the most gateways (the default region has
two).

``--ingress`` and ``--throughput-optimized`` choose the data plane (``gateway.ingress``,
``gateway.throughput_optimized``; defaults: the configuration's), set in the environment
before Ray starts (:mod:`firstlight.serve.data_plane`) and recorded in ``meta``. Prints a
table; the JSON goes to ``OUT/results.json`` (else stdout), with the command and commit,
and ``--page`` rewrites that page's section for the run (markers named after OUT's
folder name: :func:`~firstlight_bench.reports.serving_markdown.markers`); ``--tables-only --page
PAGE`` rewrites every section from the reports stored beside the page. A test holds
``docs/serving.md`` to the stored reports.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import platform
import random
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from firstlight._ports import free_port
from firstlight.config import ModelConfig, PlatformConfig, parse_config
from firstlight.engine.protocol import GenerationChunk, GenerationRequest, SamplingSettings
from firstlight.prefix import HashScheme, hint_hashes
from firstlight.routing import RequestView
from firstlight_bench.options import (
    OutOption,
    PageOption,
    PageTablesOnlyOption,
    SeedOption,
    command_line,
    csv_ints,
    page_needs_out,
    tables_page,
)
from firstlight_bench.reports.results import git_commit
from firstlight_bench.reports.sections import rewrite_sections, store_section
from firstlight_bench.reports.serving_markdown import markers, plot_hops, render_markdown
from firstlight_bench.reports.serving_report import (
    Timing,
    added_latency,
    capacity,
    phase,
    render,
    target,
)
from firstlight_bench.tools.ray_floor import FLOOR_APP, deploy_floor
from firstlight_bench.tools.serving_gateways import KILL_CLIENTS, capacity_block, kill_one_gateway

__all__ = ["app", "bench_config", "rewrite_page"]

MODEL = "bench-instant"
REGION = "bench"
WARM_UP = 20
_VOCAB = (1000, 40_000)
_CHAT_TEMPLATE = "<user>\n{}\n<assistant>\n"  # SimPromptEncoder's: one token per byte
_JSON = {"content-type": "application/json"}
_CHAT = "/v1/chat/completions"
_PATHS = (
    "direct",
    "port",
    "handle",
    "http_floor",
    "ray_serve_floor",
    "http_tokens",
    "http_chat_text",
)
_COMPARISONS = (  # (path, baseline)
    ("http_tokens", "direct"),  # the platform's added latency: the target
    ("http_tokens", "ray_serve_floor"),  # Firstlight's own share over bare Ray Serve
    ("port", "direct"),  # the replica port's hop (the platform's data path)
    ("handle", "direct"),  # Ray routing + the replica hop
    ("http_tokens", "handle"),  # HTTP proxy + gateway
    ("http_chat_text", "http_tokens"),  # chat template + tokenizing text
)


class BenchError(RuntimeError):
    """A request failed: the benchmark stops rather than report a broken run."""


# --- the measured paths ---------------------------------------------------------------


async def _time_stream(start: float, stream: AsyncIterator[Any]) -> Timing:
    """TTFT (first ``GenerationChunk``) and end-to-end of ``stream``, from ``start``."""
    first = 0.0
    async for item in stream:
        if isinstance(item, GenerationChunk):
            first = first or time.perf_counter()
    if not first:
        raise BenchError("the stream had no chunk")
    return (first - start) * 1000, (time.perf_counter() - start) * 1000


async def _direct(
    model: ModelConfig, config: PlatformConfig, prompts: Sequence[tuple[int, ...]], k: int
) -> list[Timing]:
    from firstlight.engine.sim import SimEngine

    engine = SimEngine.for_model(model, config.hints, profile="instant")
    timings = []
    try:
        for i, prompt in enumerate(prompts):
            request = GenerationRequest(f"direct-{i}", prompt, SamplingSettings(k))
            start = time.perf_counter()
            timings.append(await _time_stream(start, engine.generate(request)))
    finally:
        await engine.shutdown()
    return timings[WARM_UP:]


async def _port(
    deployment: str,
    requests: Sequence[tuple[GenerationRequest, RequestView]],
    config: PlatformConfig,
) -> list[Timing]:
    """The replica port's hop alone: this process streams from the replicas' own ports
    (taking turns), as a gateway does, with no HTTP and no routing (it built the region,
    so it holds the region's port key)."""
    from ray.serve.handle import DeploymentHandle

    from firstlight.serve.keys import launcher_key, region_keys
    from firstlight.serve.replica_port import ReplicaPortClient

    handle: Any = DeploymentHandle(deployment, REGION)
    addresses: list[str] = []
    try:
        for _ in range(50):  # Ray spreads these calls over the replicas
            address = (await handle.info.remote())["data_address"]
            if address is None:
                raise BenchError("a replica serves no port (gateway.data_path: ray-handle?)")
            if address not in addresses:
                addresses.append(address)
            if len(addresses) == 2:
                break
    finally:
        await handle.shutdown_async()
    keys = region_keys(config, REGION, launcher_key(config))
    client, timings = ReplicaPortClient(keys.port), []
    try:
        for i, (request, view) in enumerate(requests):
            start = time.perf_counter()
            stream = client.stream(addresses[i % len(addresses)], request, view, {})
            timings.append(await _time_stream(start, stream))
    finally:
        await client.aclose()
    return timings[WARM_UP:]


def _decision_mean_us(endpoint: str) -> float | None:
    """The mean time the gateways' routing policy took per decision (their
    ``firstlight_route_decision_duration_seconds`` histogram's sum over its count)."""
    text = httpx.get(f"{endpoint}/metrics", timeout=30).text
    total = {"_sum": 0.0, "_count": 0.0}
    for line in text.splitlines():
        for suffix in total:
            if line.startswith(f"firstlight_route_decision_duration_seconds{suffix}"):
                total[suffix] += float(line.rsplit(" ", 1)[1])
    if not total["_count"]:
        return None
    return round(total["_sum"] / total["_count"] * 1e6, 1)


async def _handle(
    deployment: str, requests: Sequence[tuple[GenerationRequest, RequestView]]
) -> list[Timing]:
    from ray.serve.handle import DeploymentHandle

    # Built on this loop and not cached by Serve: with RAY_SERVE_THROUGHPUT_OPTIMIZED=1
    # a handle's router runs on the loop that first uses it.
    handle: Any = DeploymentHandle(deployment, REGION)
    timings = []
    try:
        for request, view in requests:
            start = time.perf_counter()
            stream = handle.options(stream=True).generate.remote(request, routing=view)
            timings.append(await _time_stream(start, stream))
    finally:
        await handle.shutdown_async()
    return timings[WARM_UP:]


def _stream_once(client: httpx.Client, url: str, body: bytes) -> Timing:
    received = bytearray()
    start, first = time.perf_counter(), 0.0
    with client.stream("POST", url, content=body, headers=_JSON) as response:
        for piece in response.iter_raw():
            if b"data:" in piece:
                first = first or time.perf_counter()
            received += piece
    end = time.perf_counter()
    done = received.rstrip().endswith(b"data: [DONE]") and b'"error"' not in received
    if response.status_code != 200 or not done:
        raise BenchError(f"{url}: HTTP {response.status_code} {bytes(received)[-300:]!r}")
    return (first - start) * 1000, (end - start) * 1000


def _get_once(client: httpx.Client, url: str) -> Timing:
    start = time.perf_counter()
    status = client.get(url).status_code
    elapsed = (time.perf_counter() - start) * 1000
    if status != 200:
        raise BenchError(f"{url}: HTTP {status}")
    return elapsed, elapsed


# --- the platform's config ----------------------------------------------------------------


def _drop_hints(config: PlatformConfig) -> None:
    """Delete this run's Redis keys (its prefix is unique; the hint feed never expires)."""
    import redis

    client = redis.Redis.from_url(config.hints.redis_url, socket_timeout=2.0)
    try:
        keys = list(client.scan_iter(match=f"{config.hints.key_prefix}*"))
        if keys:
            client.delete(*keys)
    except redis.RedisError as exc:
        typer.echo(f"could not delete the run's hint keys: {exc}", err=True)
    finally:
        client.close()


def _chat_body(text: str, max_tokens: int, *, stream: bool) -> bytes:
    messages = [{"role": "user", "content": text}]
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    return json.dumps(body).encode()


def bench_config(
    port: int,
    prompt_tokens: int,
    run_id: str,
    *,
    ingress: str = "haproxy",
    throughput_optimized: bool = True,
    gateways: int = 2,
) -> PlatformConfig:
    """One local region serving the ``instant`` simulator on 2 replicas, auth off, with
    the given data plane (``gateway.ingress``, ``gateway.throughput_optimized``) and
    ``gateways`` gateway replicas."""
    model = {
        "name": MODEL,
        "engine": "sim",
        "sim_profile": "instant",
        "replicas": 2,
        "resources": {"num_cpus": 0},
        "max_model_len": max(2048, prompt_tokens + 256),
    }
    data: dict[str, Any] = {
        "mode": "local",
        "regions": [{"name": REGION}],
        "models": [model],
        "router": {"policy": "firstlight"},
        "hints": {"key_prefix": f"flbench:{run_id}:"},
        "auth": {"enabled": False},
        "gateway": {
            "host": "127.0.0.1",
            "port": port,
            "ingress": ingress,
            "throughput_optimized": throughput_optimized,
            "replicas": gateways,
        },
    }
    return parse_config(data, "serving benchmark")


def _overhead(options: dict[str, Any], config: PlatformConfig, endpoint: str) -> dict[str, Any]:
    """Phase 1: every path's timings (``options`` as recorded in the report's meta)."""
    from ray import serve

    from firstlight.serve.app import deployment_name

    rng, model = random.Random(options["seed"]), config.models[0]
    n, p, k = options["requests"] + WARM_UP, options["prompt_tokens"], options["max_tokens"]
    prompts = [tuple(rng.randint(*_VOCAB) for _ in range(p)) for _ in range(n)]
    token_bodies = [
        json.dumps({"model": MODEL, "prompt": list(t), "max_tokens": k, "stream": True}).encode()
        for t in prompts
    ]
    filler = max(p - len(_CHAT_TEMPLATE.format("")), 8) - 7
    chat_bodies = [
        _chat_body(f"{i:06d} " + "".join(rng.choices("abcdefgh ", k=filler)), k, stream=True)
        for i in range(n)
    ]
    scheme, run = HashScheme.for_model(model, config.hints), uuid.uuid4().hex[:8]
    handle_requests, port_requests = (
        [
            (
                GenerationRequest(f"{path}-{run}-{i}", t, SamplingSettings(k)),
                RequestView(f"{path}-{run}-{i}", len(t), hint_hashes(t, scheme), scheme.block_size),
            )
            for i, t in enumerate(prompts)
        ]
        for path in ("handle", "port")
    )
    base = endpoint.rsplit("/", 1)[0]
    http: dict[str, Callable[[httpx.Client, int], Timing]] = {
        "ray_serve_floor": lambda c, i: _stream_once(c, f"{base}/{FLOOR_APP}", token_bodies[i]),
        "http_tokens": lambda c, i: _stream_once(c, f"{endpoint}/v1/completions", token_bodies[i]),
        "http_chat_text": lambda c, i: _stream_once(c, f"{endpoint}{_CHAT}", chat_bodies[i]),
        "http_floor": lambda c, i: _get_once(c, f"{endpoint}/healthz"),
    }
    deploy_floor()  # deployed while every path is measured: the same processes run
    t: dict[str, list[Timing]] = {name: [] for name in http}
    with httpx.Client(timeout=60.0) as client:
        for i in range(n):  # the HTTP paths take turns, request by request
            for name, once in http.items():
                t[name].append(once(client, i))
    t = {name: timings[WARM_UP:] for name, timings in t.items()}
    decision_us = _decision_mean_us(endpoint)
    t["port"] = asyncio.run(_port(deployment_name(model), port_requests, config))
    t["handle"] = asyncio.run(_handle(deployment_name(model), handle_requests))
    t["direct"] = asyncio.run(_direct(model, config, prompts, k))
    serve.delete(FLOOR_APP)
    paths = {name: phase(t[name]) for name in _PATHS}
    added = {f"{o} - {b}": added_latency(paths[b], paths[o]) for o, b in _COMPARISONS}
    return {
        "paths": paths,
        "added_ms": added,
        "target": target(added["http_tokens - direct"]),
        "decision_mean_us": decision_us,
    }


def rewrite_page(page: Path) -> None:
    """Rewrite every ``serving:`` section of ``page`` from the report stored for it
    (:func:`~firstlight_bench.reports.sections.rewrite_sections`), and redraw its ``hops.png``."""
    rewrite_sections(page, "serving", markers, render_markdown)
    for name in re.findall(r"<!-- serving:([\w-]+):begin", page.read_text()):
        folder = page.parent / "benchmarks" / name
        plot_hops(json.loads((folder / "results.json").read_text()), folder / "hops.png")


class OnOff(StrEnum):
    """``--kill`` and ``--throughput-optimized``: on or off."""

    ON = "on"
    OFF = "off"


class Ingress(StrEnum):
    """``--ingress``: what takes the clients' HTTP (``gateway.ingress``)."""

    HAPROXY = "haproxy"
    SERVE_PROXY = "serve-proxy"


app = typer.Typer(add_completion=False)


@app.command()
def serving(
    requests: Annotated[int, typer.Option(min=2, help="Sequential, per path.")] = 200,
    concurrency: Annotated[str, typer.Option(help="Closed-loop client levels.")] = "1,8,32",
    gateways: Annotated[str, typer.Option(help="Gateway counts compared (A B B A).")] = "1,2",
    kill: Annotated[OnOff, typer.Option(help="Kill a gateway under load.")] = OnOff.ON,
    duration: Annotated[float, typer.Option(help="Seconds per level.")] = 10.0,
    prompt_tokens: Annotated[int, typer.Option(min=32, help="Prompt tokens.")] = 128,
    max_tokens: Annotated[int, typer.Option(help="Output tokens (overhead).")] = 8,
    seed: SeedOption = 0,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: PageTablesOnlyOption = False,
    ingress: Annotated[Ingress, typer.Option(help="gateway.ingress")] = Ingress.HAPROXY,
    throughput_optimized: Annotated[
        OnOff, typer.Option(help="gateway.throughput_optimized")
    ] = OnOff.ON,
) -> None:
    """``firstlight bench serving``: what the platform adds over the engine (on the most
    --gateways), each gateway count's capacity, and one gateway killed under load; prints
    the table (and the JSON without --out)."""
    if tables_only:
        rewrite_page(tables_page(page))
        return
    levels = csv_ints(concurrency, "--concurrency")
    counts = sorted(set(csv_ints(gateways, "--gateways")))
    if kill is OnOff.ON and max(counts) < 2:
        raise typer.BadParameter("--kill on needs a count >= 2", param_hint="--gateways")
    page_needs_out(out, page)
    options: dict[str, Any] = {  # as recorded in the report's meta
        "requests": requests,
        "concurrency": concurrency,
        "gateways": gateways,
        "kill": kill.value,
        "duration": duration,
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "seed": seed,
        "tables_only": tables_only,
        "ingress": ingress.value,
        "throughput_optimized": throughput_optimized.value,
    }
    commit = git_commit()

    from firstlight.serve.data_plane import prepare_local_ray

    port, run_id = free_port(), uuid.uuid4().hex[:8]
    optimized = throughput_optimized is OnOff.ON  # the data plane: gateway.* settings
    plane: dict[str, Any] = {"ingress": ingress.value, "throughput_optimized": optimized}
    configs = {n: bench_config(port, prompt_tokens, run_id, gateways=n, **plane) for n in counts}
    config = configs[max(counts)]

    # Before Ray Serve is imported: this process's handle path reads the settings too.
    prepare_local_ray(config.gateway)

    import ray
    from ray import serve

    from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local

    say = functools.partial(typer.echo, err=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # A B B A: each count's blocks straddle the other's, so a drift touches both alike.
    order = counts + counts[::-1]
    most, last_of_most = max(counts), len(order) - 1 - order[::-1].index(max(counts))
    rows: list[dict[str, Any]] = []
    overhead: dict[str, Any] | None = None
    kills: list[dict[str, Any]] = []
    running: LocalPlatform | None = None
    hints_note = ""
    try:
        for block, n in enumerate(order):
            if block == 0 or order[block - 1] != n:
                if running is not None:
                    stop_local(running)
                    running = None
                running = start_local(configs[n], report=say, timeout_s=300)
                hints_note, endpoint = running.hints_note, running.endpoints[REGION]
            if n == most and overhead is None:
                say("measuring overhead")
                overhead = _overhead(options, configs[n], endpoint)
            say(f"measuring throughput with {n} gateway(s), block {block}")
            url = f"{endpoint}{_CHAT}"
            rows += asyncio.run(
                capacity_block(url, MODEL, levels, duration, gateways=n, block=block)
            )
            if kill is OnOff.ON and block == last_of_most:
                for client in KILL_CLIENTS:
                    say(f"killing one of {n} gateways under load ({client} clients)")
                    run = kill_one_gateway(endpoint, REGION, MODEL, gateways=n, client=client)
                    try:
                        kills.append(asyncio.run(run))
                    except (TimeoutError, httpx.HTTPError) as exc:  # keep what was measured
                        kills.append({"client": client, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        if running is not None:
            stop_local(running)
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
        _drop_hints(config)
    report: dict[str, Any] = {
        "simulated_engine": True,
        "meta": {
            "what": "simulated engine (sim profile 'instant'), real platform",
            "command": command_line(),
            "git_commit": commit,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "ray": ray.__version__,
            "ingress": config.gateway.ingress,
            "serve_throughput_optimized": "1" if config.gateway.throughput_optimized else "0",
            "hints": hints_note,
            "options": options,
            "warm_up": WARM_UP,
            "config": config.model_dump(mode="json"),
        },
        "overhead": overhead,
        "throughput": rows,
        "capacity": capacity(rows),
        "kills": kills,
    }
    typer.echo(render(report))
    if out is not None:
        store_section(report, out, page, markers, render_markdown)
        plot_hops(report, out / "hops.png")
    else:
        typer.echo(json.dumps(report, indent=2))
