"""Closed-loop load against one region: the load of the fault tests and of the runs that
break something under load.

Who calls what: the fault tests (``tests/serve/test_region_down.py``,
``test_peer_blackhole.py``, ``test_redis_outage.py``, ``test_gateways.py``), the soak
run (:mod:`firstlight_bench.tools.soak`), the autoscaling benchmark
(:mod:`firstlight_bench.tools.autoscale`) and the gateway kill
(:func:`firstlight_bench.tools.serving_gateways.kill_one_gateway`) start a :class:`ClosedLoop`
against a region's endpoint, break something, and read its :class:`Answer` list.

The loop: each of ``clients`` clients sends one chat completion, waits for the whole
answer, then sends the next (closed loop: a slow server lowers the rate instead of
piling up requests). Requests are numbered as they are sent; even numbers are streamed,
odd ones are not, and each prompt starts ``request N:`` (``prompt_words`` words, distinct
per request after its first words). A request that does not end within ``deadline_s``
is *hung* (and lost). How a request travels, and how its answer is checked, is the
loop's :class:`Sender`:

* :class:`HttpxSender`: plain httpx, one connection pool per client, no retries; every
  answer checked the way a careful client would: status 200, some text (at least one
  non-empty content delta when streamed, a non-empty message otherwise), ``[DONE]``
  after the text, no error event, and exactly ``max_tokens`` completion tokens (the
  prompts are long enough that the model never stops early);
* :class:`~firstlight_bench.clients.closed_loop_openai.OpenAISender`: the official ``openai``
  client with its default retries (its own module: importing the client takes a
  second).

A request that fails any check is *lost*; its :attr:`Answer.outcome` says why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import httpx

from firstlight.api.sse import sse_events
from firstlight_bench.reports.results import Outcome

__all__ = [
    "HUNG",
    "Answer",
    "ChatRequest",
    "Clock",
    "ClosedLoop",
    "HttpxSender",
    "Reply",
    "Send",
    "Sender",
    "token_count",
]

HUNG = "hung"
"""The error of a request that did not end within the loop's deadline."""
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Answer:
    """One request of the loop: what its client saw (times in seconds since the loop's
    :attr:`~ClosedLoop.origin`; a non-streamed answer's first token is its whole body)
    and what only this loop records of it."""

    outcome: Outcome
    """``request_id`` is the request's number (the prompt's ``request N:``)."""
    stream: bool
    route: str | None
    """``x-firstlight-route``: local, spill_over, fail_over."""
    region: str | None
    """``x-firstlight-region``: the region's name for a local answer, the peer's for a
    forwarded one."""

    @property
    def lost(self) -> bool:
        return not self.outcome.completed

    @property
    def hung(self) -> bool:
        return self.outcome.error == HUNG

    @property
    def ended_s(self) -> float:
        """When the client had the whole answer or gave up on it (the loop records both)."""
        assert self.outcome.finish_s is not None
        return self.outcome.finish_s


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One request of the loop, as it goes to a :class:`Sender`."""

    number: int
    model: str
    content: str
    max_tokens: int

    @property
    def stream(self) -> bool:
        return self.number % 2 == 0

    def wrong_length(self, tokens: object) -> str | None:
        """Why an answer of ``tokens`` completion tokens does not count (``None``: it does)."""
        wanted = self.max_tokens
        return None if tokens == wanted else f"{tokens} completion tokens, not {wanted}"


@dataclass(frozen=True, slots=True)
class Reply:
    """What a sender got back for one request, for the loop to time and record."""

    first_text_at: float | None
    """The clock's reading at the first text (streamed) or at the whole body."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    problem: str | None = None
    """Why the answer does not count as served (``None``: it does)."""


Send = Callable[[ChatRequest], Awaitable[Reply]]
"""Sends one request and checks its answer; returns a failure as a :class:`Reply`."""


class Sender(Protocol):
    """How the loop's requests travel: one :data:`Send` per client, open while the loop
    runs; ``deadline_s`` is the loop's, ``clock`` the clock replies are timed on."""

    def connect(
        self, clients: int, deadline_s: float, clock: Clock
    ) -> AbstractAsyncContextManager[Sequence[Send]]: ...


@dataclass
class ClosedLoop:
    """``clients`` closed-loop clients sending through ``sender``: the loop of the module
    docstring; its answers are in :attr:`answers`, in the order they ended."""

    sender: Sender
    model: str
    clients: int = 3
    max_tokens: int = 8
    """Every answer's length: the prompts are long enough that none stops early."""
    prompt_words: int = 40
    deadline_s: float = 120.0
    """A request not ended by then is hung; also the senders' HTTP timeout."""
    clock: Clock = time.monotonic
    answers: list[Answer] = field(default_factory=list)
    origin: float = field(default=0.0, init=False)
    """The clock's reading the answers' times count from (set by :meth:`start`)."""
    _stop: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _progress: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _run: asyncio.Task[None] | None = field(default=None, init=False)
    _sent: int = field(default=0, init=False)

    def start(self, origin: float | None = None) -> None:
        """Start the clients (on the running event loop); their answers' times count
        from ``origin`` (a reading of :attr:`clock`; default: now)."""
        self.origin = self.clock() if origin is None else origin
        self._run = asyncio.create_task(self._clients())

    def now_s(self) -> float:
        """Seconds since :attr:`origin` (the answers' time base)."""
        return self.clock() - self.origin

    async def wait_for(self, count: int, within_s: float = 120.0) -> None:
        """Until ``count`` answers are in; ``TimeoutError`` after ``within_s``."""
        async with asyncio.timeout(within_s):
            while len(self.answers) < count:
                self._progress.clear()
                await self._progress.wait()

    async def stop(self) -> list[Answer]:
        """Let every client finish its current request, then return all answers."""
        self._stop.set()
        if self._run is not None:
            await self._run
        return self.answers

    async def _clients(self) -> None:
        async with self.sender.connect(self.clients, self.deadline_s, self.clock) as sends:
            await asyncio.gather(*(self._client(send) for send in sends))

    async def _client(self, send: Send) -> None:
        while not self._stop.is_set():
            number = self._sent
            self._sent += 1
            words = " ".join(f"w{(number * 7 + k) % 997}" for k in range(self.prompt_words))
            request = ChatRequest(number, self.model, f"request {number}: {words}", self.max_tokens)
            started = self.clock()
            try:
                async with asyncio.timeout(self.deadline_s):
                    reply = await send(request)
            except TimeoutError:
                reply = Reply(None, problem=HUNG)
            self.answers.append(self._answer(request, started, reply))
            self._progress.set()
            await asyncio.sleep(0)  # yield even when the transport never suspends

    def _answer(self, request: ChatRequest, started: float, reply: Reply) -> Answer:
        first = reply.first_text_at
        outcome = Outcome(
            request_id=str(request.number),
            arrival_s=started - self.origin,
            first_token_s=None if first is None else first - self.origin,
            finish_s=self.clock() - self.origin,
            prompt_tokens=reply.prompt_tokens,
            output_tokens=reply.output_tokens,
            replica=reply.headers.get("x-firstlight-replica"),
            error=reply.problem,
        )
        route, region = (reply.headers.get(f"x-firstlight-{n}") for n in ("route", "region"))
        return Answer(outcome, request.stream, route, region)


def token_count(value: Any) -> int:
    """A token count as a server reported it; 0 when it is not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True, slots=True)
class HttpxSender:
    """Plain httpx against ``endpoint`` (a region's base URL), no retries, every answer
    checked (module docstring)."""

    endpoint: str
    api_key: str | None = None
    transport: httpx.AsyncBaseTransport | None = None
    """The clients' transport (tests pass ``httpx.MockTransport``); ``None``: the network."""

    @asynccontextmanager
    async def connect(
        self, clients: int, deadline_s: float, clock: Clock
    ) -> AsyncIterator[Sequence[Send]]:
        headers = {} if self.api_key is None else {"authorization": f"Bearer {self.api_key}"}
        timeout = httpx.Timeout(deadline_s, connect=5.0)
        async with AsyncExitStack() as stack:
            sends = []
            for _ in range(clients):
                http = httpx.AsyncClient(
                    timeout=timeout, trust_env=False, transport=self.transport, headers=headers
                )
                sends.append(partial(self._send, await stack.enter_async_context(http), clock))
            yield sends

    async def _send(self, http: httpx.AsyncClient, clock: Clock, request: ChatRequest) -> Reply:
        body: dict[str, Any] = {
            "model": request.model,
            "messages": [{"role": "user", "content": request.content}],
            "max_tokens": request.max_tokens,
            "temperature": 0,
            "stream": request.stream,
        }
        if request.stream:
            body["stream_options"] = {"include_usage": True}
        url = f"{self.endpoint}/v1/chat/completions"
        try:
            if not request.stream:
                response = await http.post(url, json=body)
                return _checked_body(response, clock(), request)
            async with http.stream("POST", url, json=body) as response:
                return await _checked_stream(response, clock, request)
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: a malformed event
            return Reply(None, problem=f"{type(exc).__name__}: {exc}")


def _checked_body(response: httpx.Response, at: float, request: ChatRequest) -> Reply:
    """A non-streamed answer (whole at ``at``), checked."""
    headers = response.headers
    if response.status_code != 200:
        return Reply(at, headers=headers, problem=_refused(response))
    try:
        body = response.json()
        tokens = body["usage"]["completion_tokens"]
        text = body["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return Reply(at, headers=headers, problem=f"malformed body: {type(exc).__name__}: {exc}")
    problem = "no text in the answer" if not text else request.wrong_length(tokens)
    prompt = token_count(body["usage"].get("prompt_tokens"))
    return Reply(at, prompt, token_count(tokens), headers, problem)


async def _checked_stream(response: httpx.Response, clock: Clock, request: ChatRequest) -> Reply:
    """A streamed answer, read to its end and checked."""
    headers = response.headers
    if response.status_code != 200:
        await response.aread()
        return Reply(None, headers=headers, problem=_refused(response))
    first: float | None = None
    done, tokens, prompt, problem = False, None, 0, None
    async for event in sse_events(response.aiter_lines()):
        if done:  # nothing may follow [DONE]
            problem = problem or "an event after [DONE]"
            continue
        if event is None:
            done = True
            continue
        if "error" in event:
            error = event["error"]
            message = error.get("message") if isinstance(error, dict) else error
            problem = f"error event: {message}"
            continue
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
            prompt = token_count(event["usage"].get("prompt_tokens"))
        if first is None and any(
            c.get("delta", {}).get("content") for c in event.get("choices", [])
        ):
            first = clock()
    if problem is None and not done:
        problem = "no [DONE]"
    if problem is None and first is None:
        problem = "no text in the stream"
    problem = problem or request.wrong_length(tokens)
    return Reply(first, prompt, token_count(tokens), headers, problem)


def _refused(response: httpx.Response) -> str:
    return f"HTTP {response.status_code}: {response.text[:200]}"
