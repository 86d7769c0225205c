"""The serving benchmark's first phase: what the platform adds over the engine, path by
path — the engine called in process, a replica's own port, a Ray handle with the
request router, ``GET /healthz``, a bare Ray Serve app of the same shape, and the
platform's HTTP API with token ids and with text — each timed request by request, and
the added latency of each path over the one below it.

Called by :func:`firstlight_bench.tools.serving.serving` (:func:`measure_overhead`, on the region
it deployed); the statistics are :mod:`firstlight_bench.reports.serving_report`'s.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx

from firstlight.config import ModelConfig, PlatformConfig
from firstlight.engine.protocol import GenerationChunk, GenerationRequest, SamplingSettings
from firstlight.prefix import HashScheme, hint_hashes
from firstlight.routing import RequestView
from firstlight_bench.reports.serving_report import Timing, added_latency, phase, target
from firstlight_bench.tools.ray_floor import FLOOR_APP, deploy_floor

__all__ = ["CHAT_PATH", "MODEL", "REGION", "WARM_UP", "BenchError", "measure_overhead"]

MODEL = "bench-instant"
REGION = "bench"
WARM_UP = 20
_VOCAB = (1000, 40_000)
_CHAT_TEMPLATE = "<user>\n{}\n<assistant>\n"  # SimPromptEncoder's: one token per byte
_JSON = {"content-type": "application/json"}
CHAT_PATH = "/v1/chat/completions"
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


def _chat_body(text: str, max_tokens: int, *, stream: bool) -> bytes:
    messages = [{"role": "user", "content": text}]
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    return json.dumps(body).encode()


def measure_overhead(
    options: dict[str, Any], config: PlatformConfig, endpoint: str
) -> dict[str, Any]:
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
        "http_chat_text": lambda c, i: _stream_once(c, f"{endpoint}{CHAT_PATH}", chat_bodies[i]),
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
