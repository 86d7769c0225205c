"""The outlier run on one local region: its requests (the steady phase's and the planted
one), the region's configuration, the OTLP/HTTP trace receiver beside it, and what is
read back from the gateway afterwards (captures, counters, log lines).

Called by ``firstlight bench outliers`` (:mod:`firstlight_bench.tools.outliers`, whose
docstring says what is measured) through :func:`measure`, :func:`region_config` and
:func:`trace_receiver`, and by its tests (the requests, :class:`Asked`).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from firstlight._ports import free_port
from firstlight.config import DEFAULT_MODEL_NAME, PlatformConfig, parse_config
from firstlight_bench.reports.results import Outcome

__all__ = [
    "MAX_TOKENS",
    "PLANTED_CHARS",
    "REGION",
    "REPLICAS",
    "Asked",
    "measure",
    "planted_messages",
    "region_config",
    "steady_messages",
    "trace_receiver",
]

REGION = "outliers"
MAX_TOKENS = 16
"""Output tokens of every request, steady and planted."""
REPLICAS = 2
"""Model replicas: with two, every decision has a runner-up for the record to name."""
PLANTED_CHARS = {"sim": 2000, "vllm": 6000}
"""The planted prompt's length in characters: about 2,000 tokens of the simulator (one
per byte; a TTFT some 30 times the steady requests' median) and some 1,500 of the
default model's tokenizer on vLLM."""
MAX_MODEL_LEN = 8192

_TOPICS = (
    "the ocean",
    "a mountain",
    "the city",
    "a forest",
    "the desert",
    "a river",
    "the moon",
    "a garden",
)


def steady_messages(index: int) -> list[dict[str, str]]:
    """Request ``index`` of the steady phase: one short user message (about 60
    characters, the same few words in another order and number each time)."""
    topic = _TOPICS[index % len(_TOPICS)]
    text = f"Request {index:05d}: write one short sentence about {topic}."
    return [{"role": "user", "content": text}]


def planted_messages(seed: int, chars: int) -> list[dict[str, str]]:
    """The planted request: a user message of ``chars`` characters of random words
    (``seed``), shared with no steady request beyond the chat template."""
    rng = random.Random(seed)
    words: list[str] = []
    length = 0
    while length < chars:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
        words.append(word)
        length += len(word) + 1
    text = "Summarize these notes: " + " ".join(words)
    return [{"role": "user", "content": text[:chars]}]


@dataclass(frozen=True, slots=True)
class Asked:
    """One request: its phase (``steady``, ``planted``), number, wall-clock sending time (the
    captures' clock) and what its client saw (``request_id``: the server's; ``""``: none)."""

    phase: str
    index: int
    started_at: float
    outcome: Outcome

    def row(self) -> dict[str, Any]:
        """Its row of the stored report's ``asked``: keys and nulls as stored reports have."""
        o = self.outcome
        usage = o.prompt_tokens > 0  # a usage chunk counts some prompt tokens
        return {
            "phase": self.phase,
            "index": self.index,
            "started_at": self.started_at,
            "ttft_ms": o.ttft_ms,
            "e2e_ms": o.e2e_ms,
            "prompt_tokens": o.prompt_tokens if usage else None,
            "completion_tokens": o.output_tokens if usage else None,
            "request_id": o.request_id or None,
            "problem": o.error,
        }


def region_config(engine: str, port: int, otlp_port: int, cache_dir: Path | None) -> PlatformConfig:
    model: dict[str, Any] = {
        "name": DEFAULT_MODEL_NAME,
        "engine": engine,
        "replicas": REPLICAS,
        "resources": {"num_cpus": 0},
        "max_model_len": MAX_MODEL_LEN,
    }
    if engine == "vllm":
        model.update({"dtype": "float32", "kv_cache_gib": 1})
    data: dict[str, Any] = {
        "mode": "local",
        "regions": [{"name": REGION, "peers": []}],
        "models": [model],
        # One gateway: it judges every request, and the dashboard lists all its captures.
        "gateway": {"host": "127.0.0.1", "port": port, "replicas": 1},
        "hints": {"key_prefix": "firstlight:outliers:"},
        "telemetry": {"otlp_endpoint": f"http://127.0.0.1:{otlp_port}"},
    }
    if cache_dir is not None:
        data["cache_dir"] = str(cache_dir)
    return parse_config(data, "firstlight bench outliers")


class _TraceReceiver:
    """A minimal OTLP/HTTP trace receiver: keeps the trace ids of the spans it gets."""

    def __init__(self) -> None:
        self.trace_ids: set[str] = set()
        self.exports = 0
        self._lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver._lock:
                    receiver.exports += 1
                    for resource_spans in request.resource_spans:
                        for scope in resource_spans.scope_spans:
                            receiver.trace_ids.update(s.trace_id.hex() for s in scope.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def has(self, trace_id: str) -> bool:
        with self._lock:
            return trace_id in self.trace_ids


@contextmanager
def trace_receiver() -> Iterator[tuple[_TraceReceiver, int]]:
    receiver = _TraceReceiver()
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), receiver.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver, port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


async def _ask(
    client: Any, phase: str, index: int, messages: list[dict[str, str]], timeout_s: float
) -> Asked:
    import openai

    started_at = time.time()
    started = time.perf_counter()
    first: float | None = None
    usage = None
    request_id = ""
    problem: str | None = None
    try:
        stream = await client.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            messages=messages,
            temperature=0,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            timeout=timeout_s,
        )
        async for chunk in stream:
            request_id = request_id or chunk.id
            if first is None and any(c.delta.content for c in chunk.choices):
                first = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage
        if first is None or usage is None:
            problem = "no text or no usage in the stream"
    except openai.OpenAIError as exc:
        problem = f"{type(exc).__name__}: {exc}"
    prompt, output = (0, 0) if usage is None else (usage.prompt_tokens, usage.completion_tokens)
    ended = time.perf_counter()
    outcome = Outcome(request_id, started, first, ended, prompt, output, error=problem)
    return Asked(phase, index, started_at, outcome)


async def _steady(endpoint: str, requests: int, concurrency: int) -> list[Asked]:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{endpoint}/v1", api_key="none", max_retries=0)
    asked: list[Asked] = []
    numbers = iter(range(requests))

    async def worker() -> None:
        for index in numbers:
            asked.append(await _ask(client, "steady", index, steady_messages(index), 120.0))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return sorted(asked, key=lambda a: a.index)


async def _planted(endpoint: str, messages: list[dict[str, str]]) -> Asked:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{endpoint}/v1", api_key="none", max_retries=0)
    try:
        return await _ask(client, "planted", 0, messages, 600.0)
    finally:
        await client.close()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
    return body


def _captures(endpoint: str) -> list[dict[str, Any]]:
    """The gateway's captured outliers, newest first (the dashboard's last 50)."""
    state = json.loads(_get(f"{endpoint}/dashboard/api/state"))
    captures: list[dict[str, Any]] = state["outliers"]
    return captures


def _scrape(endpoint: str) -> tuple[dict[str, float], float]:
    """``firstlight_outliers_total`` by kind, and the requests the gateway has finished
    (``gen_ai_server_request_duration_seconds_count``), summed over every label."""
    from prometheus_client.parser import text_string_to_metric_families

    kinds: dict[str, float] = {"ttft": 0.0, "e2e": 0.0}
    finished = 0.0
    for family in text_string_to_metric_families(_get(f"{endpoint}/metrics").decode()):
        for sample in family.samples:
            if sample.name == "firstlight_outliers_total":
                kind = sample.labels.get("kind", "")
                kinds[kind] = kinds.get(kind, 0.0) + sample.value
            elif sample.name == "gen_ai_server_request_duration_seconds_count":
                finished += sample.value
    return kinds, finished


def _settled(endpoint: str, sent: int, timeout_s: float = 60.0) -> dict[str, float]:
    """``firstlight_outliers_total`` by kind once the gateway has finished ``sent``
    requests (it judges a request after its last byte, when the client may already have
    it); raises ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        kinds, finished = _scrape(endpoint)
        if finished >= sent:
            return kinds
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gateway finished {finished:.0f} of {sent} requests")
        time.sleep(0.2)  # polling a remote counter with a deadline, not synchronisation


def _log_records(logs_dir: Path | None) -> list[dict[str, Any]] | None:
    """Every ``firstlight.outliers`` WARNING line in the region's gateway Serve logs,
    parsed; ``None`` when no such log file can be read."""
    if logs_dir is None:
        return None
    files = sorted((logs_dir / "serve").glob(f"replica_{REGION}_*.log"))
    if not files:
        return None
    tag = "firstlight.outliers: "
    records = []
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            at = line.find(tag)
            if at < 0:
                continue
            text = line[at + len(tag) :]
            try:
                records.append(json.loads(text[: text.rfind("}") + 1]))
            except json.JSONDecodeError:
                continue
    return records


def measure(
    endpoint: str, logs_dir: Path | None, requests: int, concurrency: int, plant: list[Any]
) -> dict[str, Any]:
    steady = asyncio.run(_steady(endpoint, requests, concurrency))
    counted_steady = _settled(endpoint, len(steady))
    after_steady = _captures(endpoint)
    planted = asyncio.run(_planted(endpoint, plant))
    counted_planted = _settled(endpoint, len(steady) + 1)
    after_planted = _captures(endpoint)
    return {
        "steady": steady,
        "planted": planted,
        "after_steady": after_steady,
        "after_planted": after_planted,
        "counted_steady": counted_steady,
        "counted_planted": counted_planted,
        "log_records": _log_records(logs_dir),
    }
