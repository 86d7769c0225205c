"""A loopback HTTP server standing in for a peer region's gateway (probes, forwards)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from firstlight.regions.summary import RegionSummary

__all__ = ["PeerServer"]


class PeerServer:
    """A tiny HTTP/1.1 server on a free loopback port that answers every request with
    the current ``status`` and ``body``; ``hang`` makes it never answer (it accepts the
    connection and reads the request), ``hang_after_head`` makes it send the status line
    and headers, then nothing more."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b"{}"
        self.hang = False
        self.hang_after_head = False
        self.bodies: list[bytes] = []
        self.on_request: Callable[[], None] | None = None
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.url = ""

    def serve_summary(self, summary: RegionSummary) -> None:
        self.status = 200
        self.body = json.dumps(summary.to_json()).encode()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        self._release.set()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = (await reader.readline()).decode()
            headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            method, path, _ = request_line.split(" ", 2)
            self.requests.append((f"{method} {path}", headers))
            self.bodies.append(await reader.readexactly(int(headers.get("content-length", 0))))
            if self.on_request is not None:
                self.on_request()
            if self.hang:
                await self._release.wait()
                return
            head = (
                f"HTTP/1.1 {self.status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n"
            )
            if self.hang_after_head:
                writer.write(head.encode())
                await writer.drain()
                await self._release.wait()
                return
            writer.write(head.encode() + self.body)
            await writer.drain()
        finally:
            writer.close()
            await writer.wait_closed()
