"""Fixtures of the hints tests: real Redis clients, per-test key prefixes, task hygiene,
and a private ``redis-server`` that a test may stop and restart."""

from __future__ import annotations

import asyncio
import inspect
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from firstlight.config import HintsConfig
from firstlight.hints import redis_client
from tests.conftest import FakeClock as FakeClock  # re-exported for the hints tests

REDIS_URL = "redis://127.0.0.1:6379/0"
MODEL = "SmolLM2-135M-Instruct"

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


async def eventually(
    condition: Callable[[], object | Awaitable[object]], within_s: float = 5.0
) -> None:
    """Poll ``condition`` (sync or async) until it is truthy; fail after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"condition still false after {within_s} s")
        await asyncio.sleep(0.01)


def client_for(
    url: str = REDIS_URL, timeout_s: float = 2.0, tls_ca_file: Path | None = None
) -> Redis:
    config = HintsConfig(redis_url=url, tls_ca_file=tls_ca_file)
    return redis_client(config, connect_timeout_s=timeout_s)


@pytest.fixture
async def key_prefix() -> AsyncIterator[str]:
    """A key prefix no other test uses; every key under it is deleted afterwards."""
    prefix = f"fltest:{uuid4().hex}:"
    yield prefix
    client = client_for()
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=500)]
        if keys:
            await client.delete(*keys)
        assert [key async for key in client.scan_iter(match=f"{prefix}*")] == []
    finally:
        await client.aclose()


@pytest.fixture
async def redis(key_prefix: str) -> AsyncIterator[Redis]:
    """A client of the shared Redis on 127.0.0.1:6379 (closed afterwards)."""
    client = client_for()
    yield client
    await client.aclose()


@pytest.fixture
async def spawn() -> AsyncIterator[Spawn]:
    """Start background tasks; afterwards cancel them, check each ended by cancellation
    (not by an error) and that no task is left running."""
    started: list[asyncio.Task[None]] = []

    def start(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        started.append(task)
        return task

    yield start
    for task in started:
        task.cancel()
    outcomes = await asyncio.gather(*started, return_exceptions=True)
    for outcome in outcomes:
        assert isinstance(outcome, asyncio.CancelledError), f"task ended with {outcome!r}"
    leaked = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leaked == [], leaked


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class ServerTls:
    """PEM files of a TLS Redis: its certificate and key, and the CA that signed them."""

    cert_file: Path
    key_file: Path
    ca_file: Path


class RedisServer:
    """A ``redis-server`` of our own, without persistence, on a fixed free port; with
    ``tls``, TLS only (``rediss://localhost``), clients not asked for certificates."""

    def __init__(self, workdir: Path, tls: ServerTls | None = None) -> None:
        self.port = free_port()
        self.tls = tls
        scheme, host = ("rediss", "localhost") if tls is not None else ("redis", "127.0.0.1")
        self.url = f"{scheme}://{host}:{self.port}/0"
        self._workdir = workdir
        self._process: asyncio.subprocess.Process | None = None

    def _listen_args(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.tls.cert_file),
            "--tls-key-file", str(self.tls.key_file),
            "--tls-ca-cert-file", str(self.tls.ca_file),
            "--tls-auth-clients", "no",
        ]  # fmt: skip

    async def start(self) -> None:
        executable = shutil.which("redis-server")
        assert executable is not None, "redis-server is not on PATH"
        self._process = await asyncio.create_subprocess_exec(
            executable,
            *self._listen_args(),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self._workdir),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

        async def answers() -> bool:
            ca = self.tls.ca_file if self.tls is not None else None
            client = client_for(self.url, timeout_s=0.5, tls_ca_file=ca)
            try:
                return bool(await client.ping())
            except (RedisConnectionError, OSError):
                return False
            finally:
                await client.aclose()

        await eventually(answers, within_s=10)

    async def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL if it lingers) and reap it."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout=5)
            except TimeoutError:
                process.kill()
        await process.wait()


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A private Redis, started; always killed afterwards."""
    server = RedisServer(tmp_path)
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
