"""What the fault tests (``test_peer_blackhole.py``, ``test_redis_outage.py``) read
beside the answers their :class:`~firstlight_bench.clients.closed_loop.ClosedLoop` checks: each
request's response headers and times, recorded by a transport the load's clients share
(its :class:`~firstlight_bench.clients.closed_loop.HttpxSender`'s), and the routing decision the
gateway explains in ``x-firstlight-decision``.

The loop checks every answer's body (text, usage, ``[DONE]``, no error event) but keeps
only a few headers; :class:`RecordingTransport` keeps the rest, keyed by the request
number the loop writes into each prompt (``request N: ...``, the outcome's
``request_id``).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import NamedTuple

import httpx

from firstlight.quantiles import percentile
from firstlight_bench.clients.closed_loop import Answer

__all__ = [
    "Exchange",
    "PricedDecision",
    "RecordingTransport",
    "parse_decision",
    "request_number",
    "ttft_percentiles_ms",
]

_NUMBER = re.compile(rb'"request (\d+): ')


def request_number(body: bytes) -> int | None:
    """The number the closed loop wrote into the prompt of a request ``body`` (the
    client's JSON, or the gateway's forward of it), ``None`` when there is none."""
    found = _NUMBER.search(body)
    return int(found.group(1)) if found else None


@dataclass
class Exchange:
    """One request as the transport saw it (``time.monotonic`` seconds)."""

    number: int | None
    sent_at: float
    headers_at: float | None = None
    closed_at: float | None = None
    """When the client closed the response: its body was read to the end, or abandoned."""
    status: int | None = None
    headers: httpx.Headers | None = None

    def header(self, name: str) -> str | None:
        return None if self.headers is None else self.headers.get(name)

    @property
    def total_s(self) -> float | None:
        return None if self.closed_at is None else self.closed_at - self.sent_at


class _Timed(httpx.AsyncByteStream):
    """A response body that notes when its client closes it."""

    def __init__(self, inner: httpx.AsyncByteStream, on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close = on_close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._on_close()


class RecordingTransport(httpx.AsyncBaseTransport):
    """The network, recording each exchange. Shared by every client of a load: the
    clients' own ``aclose`` leaves it open (one client ending must not close the pool
    under the others); the test calls :meth:`close` at the end."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport(trust_env=False)
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = Exchange(request_number(request.content), time.monotonic())
        self.exchanges.append(exchange)
        response = await self._inner.handle_async_request(request)
        exchange.headers_at = time.monotonic()
        exchange.status = response.status_code
        exchange.headers = httpx.Headers(response.headers)
        assert isinstance(response.stream, httpx.AsyncByteStream)

        def closed() -> None:
            exchange.closed_at = time.monotonic()

        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Timed(response.stream, closed),
            extensions=response.extensions,
        )

    def by_number(self) -> dict[int, Exchange]:
        return {e.number: e for e in self.exchanges if e.number is not None}

    def between(self, start: float, end: float) -> list[Exchange]:
        """Exchanges sent at or after ``start`` and closed by ``end`` (monotonic)."""
        return [
            e
            for e in self.exchanges
            if e.sent_at >= start and e.closed_at is not None and e.closed_at <= end
        ]

    async def aclose(self) -> None:
        """Left open: see the class docstring."""

    async def close(self) -> None:
        await self._inner.aclose()


class PricedDecision(NamedTuple):
    """The cost model's explanation of one local routing decision."""

    policy: str
    replica: str
    reason: str
    ttft_ms: float
    rtt_ms: float
    wait_ms: float
    prefill_ms: float
    uncached_tokens: int
    cached_tokens: int
    overhead_ms: float
    runner_up: str | None


_DECISION = re.compile(
    r"^(?P<policy>\S+): (?P<replica>\S+) \((?P<reason>[^)]*)\)"
    r" ttft=(?P<ttft>[\d.]+)ms = rtt (?P<rtt>[\d.]+) \+ wait (?P<wait>[\d.]+)"
    r" \+ prefill (?P<prefill>[\d.]+) \((?P<uncached>\d+) uncached, (?P<cached>\d+) cached\)"
    r"(?: \+ reload [\d.]+ \(\d+ host-tier\))? \+ overhead (?P<overhead>[\d.]+)"
    r"(?:; runner-up (?P<runner_up>\S+) \+[\d.]+)?$"
)


def parse_decision(header: str | None) -> PricedDecision | None:
    """``x-firstlight-decision`` of a locally served request as its terms (the format of
    ``firstlight.routing.Decision.explain``), ``None`` when it is absent or not a
    priced decision."""
    found = _DECISION.match(header or "")
    if found is None:
        return None
    g = found.group
    return PricedDecision(
        g("policy"),
        g("replica"),
        g("reason"),
        float(g("ttft")),
        float(g("rtt")),
        float(g("wait")),
        float(g("prefill")),
        int(g("uncached")),
        int(g("cached")),
        float(g("overhead")),
        g("runner_up"),
    )


def ttft_percentiles_ms(answers: list[Answer]) -> tuple[float, float, float]:
    """p50, p95 and p99 of the answers' times to first token (ms); ``nan`` without any."""
    ttfts = sorted(ms for a in answers if (ms := a.outcome.ttft_ms) is not None)
    p50, p95, p99 = (percentile(ttfts, q) for q in (0.5, 0.95, 0.99))
    if p50 is None or p95 is None or p99 is None:
        nan = float("nan")
        return nan, nan, nan
    return p50, p95, p99
