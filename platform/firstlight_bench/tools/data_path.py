"""Data-path spike: how the tokens of one request can travel from a replica to the client.

Run ``firstlight bench data-path [--requests 300] [--concurrency 16] [--duration 8]
[--items 9] [--out FOLDER [--page PAGE]]``. One local Ray cluster (``num_cpus=2``, HAProxy
ingress, throughput-optimized data plane, as the platform's default), a replica
deployment of 2 replicas that streams ``--items`` small chunks with no engine behind them
(**no engine: transport only**), and in front of it each candidate path of issue 40's
"one hop for the tokens":

* ``handle``: HAProxy → an ingress replica → the replica's Ray deployment handle
  (streamed; Ray's request routing, its queue-length probe and the gRPC stream) — the
  platform's path before the replica port;
* ``replica_port``: HAProxy → an ingress replica → the chosen replica's own TCP port (a
  pooled keep-alive connection, length-prefixed JSON frames) — the replica stays a Serve
  deployment and publishes its address; the ingress chooses the replica itself;
* ``direct_ingress``: HAProxy → the replica itself as the app's ingress (Ray's direct
  ingress; the gateway's work would have to run in the model replica);
* ``bare_asgi``: the same SSE from a plain uvicorn process, no Ray — the floor of an
  HTTP stream on this machine.

Phase 1: ``--requests`` sequential streamed requests per path after 30 warm-up ones, the
paths taking turns request by request (same conditions); TTFT (first ``data:`` event)
and end-to-end, timed by the client. Phase 2: closed-loop clients (``--concurrency``)
for ``--duration`` s per path, in A B C D D C B A blocks: requests per second (the
clients share the machine's 2 cores with the paths they drive, alike for every path).

The JSON goes to ``OUT/results.json`` (with the command and commit); ``--page`` rewrites
that page's ``data-path:`` section (``docs/architecture.md``), and ``--tables-only --page
PAGE`` rewrites it from the stored report. Who calls it: a maintainer choosing the data
path (docs/architecture.md, "One hop for the tokens"). The section itself is made by
:mod:`firstlight_bench.reports.data_path_report`.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from firstlight._ports import free_port
from firstlight_bench.options import (
    OutOption,
    PageOption,
    PageTablesOnlyOption,
    command_line,
    tables_page,
)
from firstlight_bench.reports.data_path_report import PATHS, markers, render_markdown
from firstlight_bench.reports.results import git_commit
from firstlight_bench.reports.sections import rewrite_sections, store_section
from firstlight_bench.reports.serving_report import Timing, phase

__all__ = ["app", "bare_app"]

WARM_UP = 30
_FRAME = struct.Struct("!I")
_APPS = {"direct_ingress": "dp-direct", "replica_port": "dp-port", "handle": "dp-handle"}


def _event(i: int) -> bytes:
    return b'data: {"i": %d, "text": "x", "token_ids": [%d]}\n\n' % (i, 1000 + i)


async def _sse(items: AsyncIterator[int]) -> AsyncIterator[bytes]:
    async for i in items:
        if i:  # item 0 stands for the platform's ServedBy marker
            yield _event(i)
    yield b"data: [DONE]\n\n"


async def _count(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    return await reader.readexactly(size) if size else b""


def _frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload)) + payload


class _Replica:
    """The replica deployment: streams through Ray, on its own port, or as an ingress."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._port = 0

    async def generate(self, prompt: list[int], n: int) -> AsyncIterator[int]:
        async for i in _count(n):
            yield i

    async def address(self) -> str:
        """Starts this replica's own port on first call; ``host:port``."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self._port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{self._port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = json.loads(await _read_frame(reader))
                async for i in _count(int(request["n"])):
                    writer.write(_frame(b'{"i": %d, "text": "x", "token_ids": [%d]}' % (i, i)))
                    await writer.drain()  # TCP's flow control is the backpressure
                writer.write(_frame(b""))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        body = json.loads(await request.body())
        return StreamingResponse(_sse(_count(body["n"])), media_type="text/event-stream")


class _HandleIngress:
    """Relays the replica deployment's Ray stream as SSE."""

    def __init__(self, replica: Any) -> None:
        self._replica = replica

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        body = json.loads(await request.body())
        items = self._replica.options(stream=True).generate.remote(body["prompt"], body["n"])
        return StreamingResponse(_sse(items), media_type="text/event-stream")


class _PortIngress:
    """Streams from a replica's own port over a pooled connection, choosing the replica
    itself (round robin here: the spike measures transport, not choice)."""

    def __init__(self, replica: Any) -> None:
        self._replica = replica
        self._addresses: list[str] = []
        self._idle: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._next = 0

    async def _learn(self) -> None:
        for _ in range(50):  # the handle spreads these calls over both replicas
            address = await self._replica.address.remote()
            if address not in self._addresses:
                self._addresses.append(address)
            if len(self._addresses) == 2:
                return

    async def _items(self, address: str, payload: bytes) -> AsyncIterator[int]:
        pool = self._idle.setdefault(address, [])
        if pool:
            reader, writer = pool.pop()
        else:
            host, port = address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
        clean = False
        try:
            writer.write(_frame(payload))
            while frame := await _read_frame(reader):
                yield int(json.loads(frame)["i"])
            clean = True
        finally:
            if clean:
                pool.append((reader, writer))
            else:
                writer.close()

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        if len(self._addresses) < 2:
            await self._learn()
        body = await request.body()
        address = self._addresses[self._next % len(self._addresses)]
        self._next += 1
        return StreamingResponse(_sse(self._items(address, body)), media_type="text/event-stream")


async def bare_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ``bare_asgi`` path: the same SSE from a plain ASGI app (uvicorn runs it)."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    n = int(json.loads(body)["n"])
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    async for event in _sse(_count(n)):
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _deploy() -> None:
    from ray import serve

    deployment: Any = serve.deployment
    options = {"max_ongoing_requests": 256, "ray_actor_options": {"num_cpus": 0}}
    replica = deployment(_Replica).options(num_replicas=2, **options)
    for path, ingress in (("handle", _HandleIngress), ("replica_port", _PortIngress)):
        app = deployment(ingress).options(**options).bind(replica.bind())
        serve.run(app, name=_APPS[path], route_prefix=f"/{_APPS[path]}")
    direct = replica.options(name="direct")
    serve.run(direct.bind(), name=_APPS["direct_ingress"], route_prefix="/dp-direct")


def _stream_once(client: httpx.Client, url: str, body: bytes) -> Timing:
    received = bytearray()
    start, first = time.perf_counter(), 0.0
    with client.stream("POST", url, content=body) as response:
        for piece in response.iter_raw():
            if b"data:" in piece:
                first = first or time.perf_counter()
            received += piece
    end = time.perf_counter()
    if response.status_code != 200 or not received.rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError(f"{url}: HTTP {response.status_code} {bytes(received)[-200:]!r}")
    return (first - start) * 1000, (end - start) * 1000


async def _closed_loop(url: str, body: bytes, concurrency: int, duration_s: float) -> float:
    """Requests per second of ``concurrency`` clients streaming for ``duration_s``."""
    done = 0
    deadline = time.perf_counter() + duration_s
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with client.stream("POST", url, content=body) as response:
                    async for _ in response.aiter_raw():
                        pass
                    if response.status_code != 200:
                        raise RuntimeError(f"{url}: HTTP {response.status_code}")
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


def _start_bare() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "firstlight_bench.tools.data_path:bare_app",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    source_root = str(Path(__file__).resolve().parents[1])  # where firstlight_bench is
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": source_root})
    url = f"http://127.0.0.1:{port}/"
    for _ in range(200):
        try:
            httpx.post(url, content=b'{"n": 1}', timeout=1.0)
            return process, url
        except httpx.TransportError:
            time.sleep(0.05)  # waiting for a child process to listen: no event to await
    process.kill()
    raise RuntimeError("the bare uvicorn app did not start")


app = typer.Typer(add_completion=False)


@app.command()
def data_path(
    requests: Annotated[int, typer.Option(min=1, help="Sequential requests per path.")] = 300,
    items: Annotated[int, typer.Option(min=1, help="Stream items (1 + max_tokens).")] = 9,
    concurrency: Annotated[int, typer.Option(min=1, help="Closed-loop clients.")] = 16,
    duration: Annotated[float, typer.Option(help="Closed-loop seconds per path and block.")] = 8.0,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: PageTablesOnlyOption = False,
) -> None:
    """Time each path replica -> client (transport only, no engine), print the page's
    section and store the report. Run by a maintainer choosing the data path."""
    # The options as given, for the report's meta (the parameters are the only locals yet).
    options = {k: str(v) for k, v in locals().items() if k not in ("out", "page")}
    if tables_only:
        rewrite_sections(tables_page(page), "data-path", markers, render_markdown)
        return
    commit = git_commit()

    from firstlight.config import GatewayConfig
    from firstlight.serve.data_plane import prepare_local_ray

    port = free_port()
    prepare_local_ray(GatewayConfig(host="127.0.0.1", port=port))

    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    bare, bare_url = _start_bare()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        _deploy()
        urls = {p: f"http://127.0.0.1:{port}/{app}" for p, app in _APPS.items()}
        urls["bare_asgi"] = bare_url
        body = json.dumps({"prompt": list(range(128)), "n": items}).encode()
        timings: dict[str, list[Timing]] = {p: [] for p in PATHS}
        with httpx.Client(timeout=60.0) as client:
            for _ in range(requests + WARM_UP):
                for path in PATHS:
                    timings[path].append(_stream_once(client, urls[path], body))
        paths = {p: phase(t[WARM_UP:]) for p, t in timings.items()}
        rates: dict[str, list[float]] = {p: [] for p in PATHS}
        for path in PATHS + PATHS[::-1]:
            run = _closed_loop(urls[path], body, concurrency, duration)
            rates[path].append(round(asyncio.run(run), 1))
    finally:
        bare.kill()
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
    report: dict[str, Any] = {
        "transport_only": True,
        "meta": {
            "what": "no engine: each replica streams small chunks; the transport alone",
            "command": command_line(),
            "git_commit": commit,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "ray": ray.__version__,
            "options": options,
            "warm_up": WARM_UP,
        },
        "paths": paths,
        "requests_per_s": {
            p: {"blocks": r, "mean": round(sum(r) / len(r), 1)} for p, r in rates.items()
        },
    }
    typer.echo(render_markdown(report, "data-path"))
    if out is not None:
        store_section(report, out, page, markers, render_markdown)
