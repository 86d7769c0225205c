"""Serving benchmark: what the platform adds over the engine, and one gateway's throughput.

Run ``python -m firstlight.bench.serving`` (options: ``--requests 200 --concurrency
1,8,32 --prompt-tokens 128 --max-tokens 8 --duration 10 --out FILE``). Everything runs in
one process and one local Ray cluster (2 CPUs): a one-region platform whose model is the
simulator's ``instant`` profile (2 replicas, microsecond steps), so the numbers are the
platform's own cost. **Simulated engine, real platform**: the report says
``"simulated_engine": true``.

1. Overhead, ``--requests`` sequential requests per path, the same ``--prompt-tokens``
   random token prompts on each, ``--max-tokens`` output tokens; TTFT (first chunk or
   first SSE ``data:`` event) and end-to-end, p50/p90/p99, measured by the caller:

   * ``direct``: a ``SimEngine`` (``instant``) in this process, no Ray;
   * ``handle``: the model deployment's Ray handle from this process (Ray routing through
     the Firstlight request router, which then lives here, plus the replica hop);
   * ``http_tokens``: streaming ``POST /v1/completions`` with ``prompt`` as token ids
     (httpx, keep-alive): Serve's HTTP proxy → gateway → router → replica;
   * ``http_chat_text``: streaming ``POST /v1/chat/completions`` with a text prompt of
     the same length once templated (the sim byte-level encoder, not a real tokenizer);
   * ``http_floor``: ``GET /healthz`` (proxy → gateway ASGI, no model call).

   ``added_ms`` subtracts percentiles (a difference of percentiles, not a percentile of
   differences); ``target`` checks the issue's goal: added p50 ≤ 3 ms for tokens over HTTP.
2. Throughput of the region's single gateway replica: closed-loop clients (asyncio +
   ``httpx.AsyncClient`` in this process) at each ``--concurrency`` for ``--duration`` s,
   non-streaming chat completions of a short text prompt with ``max_tokens=1``:
   requests/s and p50/p99 latency. The clients share the 2 cores with Ray.

Prints a table; the JSON report goes to ``--out`` (or to stdout after the table).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from firstlight.config import ModelConfig, PlatformConfig, parse_config
from firstlight.engine.protocol import GenerationChunk, GenerationRequest, SamplingSettings
from firstlight.prefix import HashScheme, hint_hashes
from firstlight.routing import RequestView

__all__ = ["added_latency", "main", "percentile", "render", "summarize", "throughput"]

MODEL = "bench-instant"
REGION = "bench"
TARGET_ADDED_P50_MS = 3.0
WARM_UP = 20
_VOCAB = (1000, 40_000)
_CHAT_TEMPLATE = "<user>\n{}\n<assistant>\n"  # SimPromptEncoder's, one token per byte
_JSON = {"content-type": "application/json"}
_PATHS = ("direct", "handle", "http_tokens", "http_chat_text", "http_floor")

Timing = tuple[float, float]
"""(TTFT, end-to-end) of one request, milliseconds."""


class BenchError(RuntimeError):
    """A request failed: the benchmark stops rather than report a broken run."""


# --- statistics and report (pure) -----------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolating linearly between the closest ranks
    (numpy's default). Raises ``ValueError`` for no samples or ``q`` out of range."""
    if not samples or not 0 <= q <= 100:
        raise ValueError(f"percentile {q} of {len(samples)} samples")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Count, mean, p50, p90 and p99 of ``samples`` (milliseconds, 3 decimals)."""
    stats = {f"p{q}": percentile(samples, q) for q in (50, 90, 99)}
    stats["mean"] = sum(samples) / len(samples)
    return {"n": len(samples), **{k: round(v, 3) for k, v in stats.items()}}


def phase(timings: Sequence[Timing]) -> dict[str, dict[str, float]]:
    """Summaries of the TTFTs and end-to-end times of one path."""
    return {
        "ttft_ms": summarize([t for t, _ in timings]),
        "e2e_ms": summarize([e for _, e in timings]),
    }


def added_latency(
    base: dict[str, dict[str, float]], other: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """``other - base`` at p50 and p99, for each metric both have."""
    return {
        metric: {q: round(other[metric][q] - base[metric][q], 3) for q in ("p50", "p99")}
        for metric in ("ttft_ms", "e2e_ms")
        if metric in base and metric in other
    }


def throughput(
    latencies_ms: Sequence[float], elapsed_s: float, errors: int, concurrency: int
) -> dict[str, float]:
    """One closed-loop level: completed requests/s and latency percentiles."""
    done = len(latencies_ms)
    return {
        "concurrency": concurrency,
        "requests": done,
        "errors": errors,
        "elapsed_s": round(elapsed_s, 3),
        "requests_per_s": round(done / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "p50_ms": round(percentile(latencies_ms, 50), 3) if done else math.nan,
        "p99_ms": round(percentile(latencies_ms, 99), 3) if done else math.nan,
    }


def _row(label: str, cells: Sequence[Any], fmt: str = ".3f", width: int = 10) -> str:
    shown = (format(c, fmt) if isinstance(c, float) else str(c) for c in cells)
    return f"{label:<30}" + "".join(f"{s:>{width}}" for s in shown)


def render(report: dict[str, Any]) -> str:
    """The report as a readable table (what the module docstring describes)."""
    meta, overhead = report["meta"], report["overhead"]
    target = overhead["target"]
    metrics = ("ttft_ms", "e2e_ms")
    lines = [
        "Firstlight serving benchmark: SIMULATED ENGINE (sim profile 'instant'), REAL PLATFORM",
        f"machine: os.cpu_count()={meta['cpu_count']}, {meta['platform']}, Python "
        f"{meta['python']}, Ray {meta['ray']} (num_cpus=2; this process's clients share "
        "the same cores)",
        f"overhead: {meta['requests']} sequential requests per path (+{meta['warm_up_requests']}"
        f" warm-up), {meta['prompt_tokens']} prompt tokens, max_tokens={meta['max_tokens']}, "
        f"{meta['replicas']} replicas; {meta['hints']}",
        "",
        _row("path (ms)", ["TTFT p50", "p90", "p99", "e2e p50", "p90", "p99"]),
    ]
    for name, stats in overhead["paths"].items():
        lines.append(_row(name, [stats[m][q] for m in metrics for q in ("p50", "p90", "p99")]))
    lines += ["", _row("added (ms, diff of percentiles)", ["TTFT p50", "p99", "e2e p50", "p99"])]
    for name, added in overhead["added_ms"].items():
        lines.append(_row(name, [added[m][q] for m in metrics for q in ("p50", "p99")], "+.3f"))
    verdict = {True: "MET", False: "NOT MET"}
    lines += [
        "",
        f"target (added p50 <= {target['p50_ms']} ms, http_tokens - direct): "
        f"TTFT {target['ttft_added_p50_ms']:+.3f} ms {verdict[target['ttft_met']]}; "
        f"e2e {target['e2e_added_p50_ms']:+.3f} ms {verdict[target['e2e_met']]}",
        "",
        "throughput of one gateway replica (non-streaming chat, max_tokens=1, closed loop, "
        f"{meta['duration_s_per_level']:g} s per level; clients share the 2 cores with Ray)",
        _row("concurrency", ["req/s", "p50 ms", "p99 ms", "requests", "errors"]),
    ]
    for r in report["throughput"]:
        cells = [r["requests_per_s"], r["p50_ms"], r["p99_ms"], r["requests"], r["errors"]]
        lines.append(_row(str(r["concurrency"]), cells))
    return "\n".join(lines)


# --- the measured paths ---------------------------------------------------------------


def _timed(run: Callable[[Callable[[], None]], None]) -> Timing:
    """Time ``run(mark_first)``; ``mark_first`` records the first output (once)."""
    first: list[float] = []
    start = time.perf_counter()

    def mark() -> None:
        if not first:
            first.append(time.perf_counter())

    run(mark)
    end = time.perf_counter()
    if not first:
        raise BenchError("the request produced no output")
    return (first[0] - start) * 1000, (end - start) * 1000


async def _direct(
    model: ModelConfig, config: PlatformConfig, prompts: Sequence[tuple[int, ...]], max_tokens: int
) -> list[Timing]:
    from firstlight.engine.sim import SimEngine

    engine = SimEngine.for_model(model, config.hints, profile="instant")
    timings: list[Timing] = []
    try:
        for i, prompt in enumerate(prompts):
            request = GenerationRequest(f"direct-{i}", prompt, SamplingSettings(max_tokens))
            start = time.perf_counter()
            first: float | None = None
            async for _chunk in engine.generate(request):
                if first is None:
                    first = time.perf_counter()
            end = time.perf_counter()
            assert first is not None
            timings.append(((first - start) * 1000, (end - start) * 1000))
    finally:
        await engine.shutdown()
    return timings[WARM_UP:]


def _http_stream(client: httpx.Client, url: str, bodies: Sequence[bytes]) -> list[Timing]:
    timings = []
    for body in bodies:
        received = bytearray()

        def run(mark: Callable[[], None], body: bytes = body, got: bytearray = received) -> None:
            with client.stream("POST", url, content=body, headers=_JSON) as response:
                for piece in response.iter_raw():
                    if b"data:" in piece:
                        mark()
                    got += piece
                if response.status_code != 200:
                    raise BenchError(f"HTTP {response.status_code}: {bytes(got)[:300]!r}")

        timings.append(_timed(run))
        if not received.rstrip().endswith(b"data: [DONE]") or b'"error"' in received:
            raise BenchError(f"bad stream: {bytes(received)[-300:]!r}")
    return timings[WARM_UP:]


def _http_floor(client: httpx.Client, url: str, n: int) -> list[Timing]:
    timings = []
    for _ in range(n + WARM_UP):
        start = time.perf_counter()
        response = client.get(url)
        elapsed = (time.perf_counter() - start) * 1000
        if response.status_code != 200:
            raise BenchError(f"HTTP {response.status_code} from {url}")
        timings.append((elapsed, elapsed))
    return timings[WARM_UP:]


def _handle(handle: Any, requests: Sequence[tuple[GenerationRequest, RequestView]]) -> list[Timing]:
    timings = []
    for request, view in requests:

        def run(mark: Callable[[], None], r: GenerationRequest = request, v: Any = view) -> None:
            for item in handle.generate.remote(r, routing=v):
                if isinstance(item, GenerationChunk):
                    mark()

        timings.append(_timed(run))
    return timings[WARM_UP:]


async def _closed_loop(
    client: httpx.AsyncClient, url: str, concurrency: int, duration_s: float
) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s

    async def worker(w: int) -> None:
        nonlocal errors
        i = 0
        while time.perf_counter() < deadline:
            i += 1
            body = _chat_body(f"Say hi {w}-{i}.", 1, stream=False)
            start = time.perf_counter()
            try:
                response = await client.post(url, content=body, headers=_JSON)
                ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append((time.perf_counter() - start) * 1000)
            else:
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return throughput(latencies, time.perf_counter() - start, errors, concurrency)


async def _throughput(url: str, levels: Sequence[int], duration_s: float) -> list[dict[str, float]]:
    limits = httpx.Limits(max_connections=max(levels), max_keepalive_connections=max(levels))
    async with httpx.AsyncClient(limits=limits, timeout=60.0) as client:
        await _closed_loop(client, url, max(levels), min(2.0, duration_s))  # warm-up
        return [await _closed_loop(client, url, c, duration_s) for c in levels]


# --- set-up ---------------------------------------------------------------------------


def _chat_body(text: str, max_tokens: int, *, stream: bool) -> bytes:
    messages = [{"role": "user", "content": text}]
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    return json.dumps(body).encode()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def bench_config(port: int, prompt_tokens: int, run_id: str) -> PlatformConfig:
    """One local region serving the ``instant`` simulator on 2 replicas, auth off."""
    model = {
        "name": MODEL,
        "engine": "sim",
        "sim_profile": "instant",
        "replicas": 2,
        "resources": {"num_cpus": 0},
        "max_model_len": max(2048, prompt_tokens + 256),
    }
    data = {
        "mode": "local",
        "regions": [{"name": REGION}],
        "models": [model],
        "router": {"policy": "firstlight"},
        "hints": {"key_prefix": f"flbench:{run_id}:"},
        "auth": {"enabled": False},
        "gateway": {"host": "127.0.0.1", "port": port},
    }
    return parse_config(data, "serving benchmark")


def _overhead(args: argparse.Namespace, config: PlatformConfig, endpoint: str) -> dict[str, Any]:
    from ray import serve

    from firstlight.serve.app import deployment_name

    rng = random.Random(args.seed)
    model = config.models[0]
    n, p, k = args.requests + WARM_UP, args.prompt_tokens, args.max_tokens
    prompts = [tuple(rng.randint(*_VOCAB) for _ in range(p)) for _ in range(n)]
    token_bodies = [
        json.dumps({"model": MODEL, "prompt": list(t), "max_tokens": k, "stream": True}).encode()
        for t in prompts
    ]
    filler = max(p - len(_CHAT_TEMPLATE.format("")), 8)
    texts = [f"{i:06d} " + "".join(rng.choices("abcdefgh ", k=filler - 7)) for i in range(n)]
    scheme = HashScheme.for_model(model, config.hints)
    run = uuid.uuid4().hex[:8]
    handle_requests = [
        (
            GenerationRequest(f"handle-{run}-{i}", t, SamplingSettings(k)),
            RequestView(f"handle-{run}-{i}", len(t), hint_hashes(t, scheme), scheme.block_size),
        )
        for i, t in enumerate(prompts)
    ]
    timings: dict[str, list[Timing]] = {}
    with httpx.Client(timeout=60.0) as client:
        timings["http_floor"] = _http_floor(client, f"{endpoint}/healthz", args.requests)
        url = f"{endpoint}/v1/completions"
        timings["http_tokens"] = _http_stream(client, url, token_bodies)
        chat_bodies = [_chat_body(t, k, stream=True) for t in texts]
        timings["http_chat_text"] = _http_stream(
            client, f"{endpoint}/v1/chat/completions", chat_bodies
        )
    handle = serve.get_deployment_handle(deployment_name(model), app_name=REGION)
    timings["handle"] = _handle(handle.options(stream=True), handle_requests)
    timings["direct"] = asyncio.run(_direct(model, config, prompts, k))
    paths = {name: phase(timings[name]) for name in _PATHS}
    added = {
        "http_tokens - direct": added_latency(paths["direct"], paths["http_tokens"]),
        "handle - direct": added_latency(paths["direct"], paths["handle"]),
        "http_tokens - handle": added_latency(paths["handle"], paths["http_tokens"]),
        "http_chat_text - http_tokens": added_latency(
            paths["http_tokens"], paths["http_chat_text"]
        ),
    }
    platform_added = added["http_tokens - direct"]
    return {
        "paths": paths,
        "added_ms": added,
        "target": {
            "p50_ms": TARGET_ADDED_P50_MS,
            "ttft_added_p50_ms": platform_added["ttft_ms"]["p50"],
            "ttft_met": platform_added["ttft_ms"]["p50"] <= TARGET_ADDED_P50_MS,
            "e2e_added_p50_ms": platform_added["e2e_ms"]["p50"],
            "e2e_met": platform_added["e2e_ms"]["p50"] <= TARGET_ADDED_P50_MS,
        },
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse options, start the platform, measure, shut down; print and return the report."""
    parser = argparse.ArgumentParser(prog="python -m firstlight.bench.serving")
    parser.add_argument("--requests", type=int, default=200, help="sequential, per path")
    parser.add_argument("--concurrency", default="1,8,32", help="closed-loop client levels")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per level")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=8, help="output tokens (overhead)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c]
    if args.requests < 1 or not levels or min(levels) < 1 or args.prompt_tokens < 32:
        parser.error("--requests and --concurrency must be >= 1, --prompt-tokens >= 32")

    import ray
    from ray import serve

    from firstlight.serve.local import start_local, stop_local

    config = bench_config(_free_port(), args.prompt_tokens, uuid.uuid4().hex[:8])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        running = start_local(config, report=lambda m: print(m, file=sys.stderr), timeout_s=300)
        try:
            endpoint = running.endpoints[REGION]
            print("measuring overhead", file=sys.stderr)
            overhead = _overhead(args, config, endpoint)
            print("measuring throughput", file=sys.stderr)
            url = f"{endpoint}/v1/chat/completions"
            rows = asyncio.run(_throughput(url, levels, args.duration))
        finally:
            stop_local(running)
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
    report: dict[str, Any] = {
        "simulated_engine": True,
        "meta": {
            "what": "simulated engine (sim profile 'instant'), real platform",
            "cpu_count": os.cpu_count(),
            "ray_num_cpus": 2,
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "ray": ray.__version__,
            "hints": running.hints_note,
            "requests": args.requests,
            "warm_up_requests": WARM_UP,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "replicas": config.models[0].replicas,
            "duration_s_per_level": args.duration,
            "config": config.model_dump(mode="json"),
        },
        "overhead": overhead,
        "throughput": rows,
    }
    print(render(report))
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return report


if __name__ == "__main__":
    main()
