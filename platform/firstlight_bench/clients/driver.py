"""The live load driver: replays a workload over HTTP against running region gateways.

Who calls what: ``firstlight bench run`` and ``firstlight bench live``
(:mod:`firstlight_bench.clients.live`) replay a generated workload with :func:`replay_trace`;
tests call :func:`replay` directly with an ``httpx.AsyncClient`` of their own.

The replay is *open loop*: each request is sent at its ``arrival_s`` offset from the
start of the replay whatever happened to the earlier ones, so a slow server shows up as
growing TTFT, not as a lower offered rate. Every time is measured on the client: an
:class:`~firstlight_bench.reports.results.Outcome`'s times are seconds since the replay started,
like the trace's ``arrival_s``, and TTFT counts from the *scheduled* arrival.

Each request is ``POST {target}/v1/completions`` with the prompt as a list of token ids,
``temperature: 0``, streamed with ``stream_options.include_usage``; the target is
``targets[request.client_region % len(targets)]``, a region's endpoint such as
``http://127.0.0.1:8000/us-east`` — unless a ``steer`` (a global load balancer in front
of the regions, :class:`~firstlight_bench.simulator.region_arms.WaterfallBalancer`) picks another
region: the driver then emulates the WAN to it, sending the request half the round trip
late and counting its tokens half the round trip later than they came (a constant delay
line: TTFT and end grow by the round trip, the gaps between tokens do not).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from firstlight.api.sse import sse_events
from firstlight_bench.reports.results import Outcome
from firstlight_bench.workloads import TraceRequest, Workload

__all__ = ["replay", "replay_trace"]

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
Steer = Callable[[TraceRequest, float], tuple[int, float]]
"""Which target serves a request sent at a time (seconds since the start), and the
round trip to it from the client's region in ms."""


@dataclass(slots=True)
class _Stream:
    """What one request's response showed so far (times relative to the replay start)."""

    first_choice_s: float | None = None
    first_text_s: float | None = None
    finish_s: float | None = None
    text_events: int = 0
    usage: Mapping[str, Any] | None = None
    served_region: int | None = None
    replica: str | None = None
    error: str | None = None
    sent_s: float | None = None
    wan_one_way_s: float = 0.0
    """Half the emulated round trip to a region a ``steer`` picked (0: the client's own)."""
    predicted_ms: float | None = None
    """The gateway's ``x-firstlight-predicted-ttft-ms``: the TTFT it predicted for the
    route it chose, from its decision."""

    @property
    def first_token_s(self) -> float | None:
        return self.first_text_s if self.first_text_s is not None else self.first_choice_s


@dataclass(slots=True)
class _Replay:
    """The shared state of one replay."""

    targets: tuple[str, ...]
    model: str
    timeout_s: float
    client: httpx.AsyncClient
    semaphore: asyncio.Semaphore
    clock: Clock
    start: float
    sleep: Sleep
    steer: Steer | None = None
    simulated: bool = False

    def now(self) -> float:
        return self.clock() - self.start


def region_index(targets: Sequence[str], region: str | None) -> int | None:
    """The index of the target whose URL ends with ``/<region>``; ``None`` when no
    target does (or no region was reported). Called for each response's
    ``x-firstlight-region`` header."""
    if not region:
        return None
    for index, target in enumerate(targets):
        if target.rstrip("/").endswith(f"/{region}"):
            return index
    return None


def _float(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _handle_event(run: _Replay, state: _Stream, event: dict[str, Any] | None) -> bool:
    """Record one SSE event (``None``: ``[DONE]``); returns True at ``[DONE]``."""
    if event is None:
        state.finish_s = run.now()
        return True
    if "error" in event:
        error = event["error"]
        kind = error.get("code") or error.get("type") if isinstance(error, dict) else None
        state.error = f"stream error: {kind or 'unknown'}"
        return False
    choices = event.get("choices") or []
    if choices:
        now = run.now()
        if state.first_choice_s is None:
            state.first_choice_s = now
        text = choices[0].get("text") if isinstance(choices[0], dict) else None
        if text:
            state.text_events += 1
            if state.first_text_s is None:
                state.first_text_s = now
    if isinstance(event.get("usage"), dict):
        state.usage = event["usage"]
    return False


async def _stream(run: _Replay, request: TraceRequest, state: _Stream) -> None:
    """Send ``request`` and read its SSE stream into ``state`` (error or finish)."""
    index = request.client_region % len(run.targets)
    if run.steer is not None:
        index, rtt_ms = run.steer(request, run.now())
        state.wan_one_way_s = rtt_ms / 2000.0
        if state.wan_one_way_s > 0:
            await run.sleep(state.wan_one_way_s)
    target = run.targets[index]
    body = {
        "model": run.model,
        "prompt": list(request.prompt),
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    url = f"{target.rstrip('/')}/v1/completions"
    state.sent_s = run.now()
    async with run.client.stream("POST", url, json=body, timeout=run.timeout_s) as response:
        headers = response.headers
        if headers.get("x-firstlight-simulated", "").lower() == "true":
            run.simulated = True
        if response.status_code >= 400:
            await response.aread()
            state.error = f"HTTP {response.status_code}"
            return
        state.served_region = region_index(run.targets, headers.get("x-firstlight-region"))
        state.replica = headers.get("x-firstlight-replica")
        state.predicted_ms = _float(headers.get("x-firstlight-predicted-ttft-ms"))
        async for event in sse_events(response.aiter_lines()):
            if _handle_event(run, state, event):
                return
    state.error = state.error or "stream ended without [DONE]"


def _outcome(request: TraceRequest, state: _Stream) -> Outcome:
    """The client's view of one request, from what its stream showed."""
    usage = state.usage or {}
    details = usage.get("prompt_tokens_details")
    prompt_tokens = _int(usage.get("prompt_tokens")) or len(request.prompt)
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    completed = state.error is None and state.finish_s is not None
    output = _int(usage.get("completion_tokens")) if completed else None
    first = state.first_token_s
    if completed and first is None and (output or 0) > 0:
        first = state.finish_s  # tokens were counted but never shown: seen at the end
    back = state.wan_one_way_s  # the emulated WAN's return leg
    finish = state.finish_s + back if completed and state.finish_s is not None else None
    predicted = None
    if state.predicted_ms is not None and state.sent_s is not None:
        # From the scheduled arrival, as the TTFT is (a full client queue sends late).
        late_ms = max(state.sent_s - request.arrival_s, 0.0) * 1000.0
        predicted = state.predicted_ms + late_ms + state.wan_one_way_s * 1000.0
    return Outcome(
        request_id=request.request_id,
        arrival_s=request.arrival_s,
        first_token_s=None if first is None else first + back,
        finish_s=finish,
        prompt_tokens=prompt_tokens,
        output_tokens=output if output is not None else state.text_events,
        cached_tokens=min(max(cached or 0, 0), prompt_tokens),
        client_region=request.client_region,
        served_region=state.served_region,
        replica=state.replica,
        error=None if completed else (state.error or "no response"),
        predicted_ttft_ms=predicted,
    )


async def _one(run: _Replay, request: TraceRequest) -> Outcome:
    """One request from semaphore to outcome; never raises for the request's failure."""
    state = _Stream()
    async with run.semaphore:
        try:
            async with asyncio.timeout(run.timeout_s):
                await _stream(run, request, state)
        except (TimeoutError, httpx.TimeoutException):
            state.error = "timeout"
        except (httpx.HTTPError, OSError, ValueError, KeyError, TypeError) as exc:
            # Connection failures, protocol errors, malformed events: this request's fate.
            state.error = type(exc).__name__
    if state.error is not None:
        state.finish_s = None
    return _outcome(request, state)


async def _replay(
    workload: Workload,
    targets: Sequence[str],
    *,
    max_concurrency: int,
    model: str,
    timeout_s: float,
    client: httpx.AsyncClient | None,
    clock: Clock,
    sleep: Sleep,
    steer: Steer | None = None,
) -> tuple[list[Outcome], bool]:
    """:func:`replay`, also saying whether any response was ``x-firstlight-simulated``."""
    if not targets:
        raise ValueError("targets: at least one region endpoint is needed")
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency = {max_concurrency}: must be >= 1")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s = {timeout_s!r}: must be finite and > 0")
    own = client is None
    http = client or httpx.AsyncClient(
        timeout=timeout_s,
        limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=64),
    )
    run = _Replay(
        targets=tuple(targets),
        model=model,
        timeout_s=timeout_s,
        client=http,
        semaphore=asyncio.Semaphore(max_concurrency),
        clock=clock,
        start=clock(),
        sleep=sleep,
        steer=steer,
    )
    tasks: list[asyncio.Task[Outcome]] = []
    try:
        for request in sorted(workload.requests, key=lambda r: r.arrival_s):
            # Never early: a sleep may wake a little before its deadline, so re-check.
            while (wait := request.arrival_s - run.now()) > 0:
                await sleep(wait)
            tasks.append(asyncio.create_task(_one(run, request)))
        outcomes = list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        if own:
            await http.aclose()
    order = {r.request_id: i for i, r in enumerate(workload.requests)}
    outcomes.sort(key=lambda o: order[o.request_id])
    return outcomes, run.simulated


async def replay(
    workload: Workload,
    targets: Sequence[str],
    *,
    max_concurrency: int = 256,
    model: str,
    timeout_s: float = 120.0,
    client: httpx.AsyncClient | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    steer: Steer | None = None,
) -> list[Outcome]:
    """Replay ``workload`` open loop against ``targets``; one :class:`Outcome` per request,
    in the workload's order.

    Called by :func:`replay_trace` and by tests. Each request is sent no earlier than its
    ``arrival_s`` after the start (``clock`` and ``sleep`` are injectable for tests), to
    ``targets[client_region % len(targets)]``. At most ``max_concurrency`` requests are
    in flight; a request that waits for a slot still counts its TTFT (and e2e) from its
    scheduled arrival, since that is what a client sees. With ``steer``, each request
    goes to the target it names, over the emulated WAN of the module docstring.

    Measured on the client, in seconds since the start: ``first_token_s`` when the first
    event with non-empty text arrives (else the first event with ``choices``),
    ``finish_s`` at ``data: [DONE]``. Token counts and ``cached_tokens`` come from the
    final usage chunk (without one: the prompt's length and the number of text events);
    ``served_region`` is the index of the target whose URL ends with
    ``/<x-firstlight-region>``, ``replica`` the ``x-firstlight-replica`` header.

    A request's failure never raises: an HTTP error status (``"HTTP 503"``), an SSE error
    event (``"stream error: <code>"``), no ``[DONE]``, a timeout after ``timeout_s``
    (``"timeout"``) or a connection error (the exception's class name) gives an Outcome
    with ``error`` set and ``finish_s=None``. Raises ``ValueError`` for no targets, a
    ``max_concurrency`` below 1 or a non-positive ``timeout_s``. Without ``client``, one
    is made (and closed) for the replay.
    """
    outcomes, _ = await _replay(
        workload,
        targets,
        max_concurrency=max_concurrency,
        model=model,
        timeout_s=timeout_s,
        client=client,
        clock=clock,
        sleep=sleep,
        steer=steer,
    )
    return outcomes


def replay_trace(
    trace: Workload,
    targets: Sequence[str],
    *,
    model: str,
    max_concurrency: int,
    timeout_s: float,
    steer: Steer | None = None,
) -> tuple[list[Outcome], bool]:
    """Replay ``trace`` in real time (its own event loop); the outcomes and whether any
    response was simulated. Called by :func:`firstlight_bench.clients.live.run_live` and
    :func:`firstlight_bench.clients.live.run_live_arms`."""
    return asyncio.run(
        _replay(
            trace,
            targets,
            max_concurrency=max_concurrency,
            model=model,
            timeout_s=timeout_s,
            client=None,
            clock=time.monotonic,
            sleep=asyncio.sleep,
            steer=steer,
        )
    )
