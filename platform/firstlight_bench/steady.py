"""Steady closed-loop load with every answer checked: the fault runs' client.

Who calls what: the fault tests (``tests/serve/test_region_down.py``,
``tests/serve/test_peer_blackhole.py``) and the soak run (:mod:`firstlight_bench.soak`)
start a :class:`SteadyLoad` against a region's endpoint, break something, and read its
:class:`Answer` list. Each client sends one chat completion, waits for the whole answer,
then sends the next (closed loop: a slow server lowers the rate instead of piling up
requests). Requests alternate between streamed and non-streamed; every answer is checked
the way a careful client would: status 200, some text (at least one non-empty content
delta when streamed, a non-empty message otherwise), ``[DONE]`` after the text, no error
event, and exactly ``max_tokens`` completion tokens (the prompts are long enough that the
model never stops early). A request that fails any check is *lost*; one that does not end
within ``deadline_s`` is *hung* (and lost).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from firstlight.api.sse import sse_events

__all__ = ["Answer", "SteadyLoad"]


@dataclass(frozen=True, slots=True)
class Answer:
    """One request as its client saw it (times in seconds since the load started)."""

    started_s: float
    ttft_s: float | None
    """Until the first text (streamed) or the whole body (non-streamed)."""
    total_s: float
    status: int
    stream: bool
    route: str | None
    """``x-firstlight-route``: local, spill_over, fail_over."""
    region: str | None
    """``x-firstlight-region`` of a local answer, the peer's for a forwarded one."""
    problem: str | None
    """Why the answer does not count as served (``None``: it does)."""

    @property
    def lost(self) -> bool:
        return self.problem is not None

    @property
    def hung(self) -> bool:
        return self.problem == "hung"


@dataclass
class SteadyLoad:
    """``clients`` closed-loop clients against ``endpoint`` (a region's base URL)."""

    endpoint: str
    model: str
    clients: int = 3
    max_tokens: int = 8
    prompt_words: int = 40
    """Length of each prompt (distinct per request after its first words)."""
    api_key: str | None = None
    deadline_s: float = 120.0
    answers: list[Answer] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic
    transport: httpx.AsyncBaseTransport | None = None
    """The clients' transport (tests pass ``httpx.MockTransport``); ``None``: the network."""
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _started: float = 0.0
    _sent: int = 0
    _progress: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self) -> None:
        """Start the clients (on the running event loop)."""
        self._started = self.clock()
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]

    def now_s(self) -> float:
        """Seconds since :meth:`start` (the answers' time base)."""
        return self.clock() - self._started

    async def wait_for(self, count: int, within_s: float = 120.0) -> None:
        """Until ``count`` answers are in; ``AssertionError`` after ``within_s``."""
        async with asyncio.timeout(within_s):
            while len(self.answers) < count:
                self._progress.clear()
                await self._progress.wait()

    async def stop(self) -> list[Answer]:
        """Let every client finish its current request, then return all answers."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return self.answers

    async def _client(self, index: int) -> None:
        headers = {}
        if self.api_key is not None:
            headers["authorization"] = f"Bearer {self.api_key}"
        timeout = httpx.Timeout(self.deadline_s, connect=5.0)
        async with httpx.AsyncClient(
            timeout=timeout, trust_env=False, transport=self.transport
        ) as client:
            while not self._stop.is_set():
                number = self._sent
                self._sent += 1
                started = self.clock()
                try:
                    async with asyncio.timeout(self.deadline_s):
                        answer = await self._one(client, headers, number, started)
                except TimeoutError:
                    answer = self._answer(started, None, 0, number % 2 == 0, None, "hung")
                except (httpx.HTTPError, ValueError) as exc:  # ValueError: a malformed event
                    answer = self._answer(
                        started, None, 0, number % 2 == 0, None, f"{type(exc).__name__}: {exc}"
                    )
                self.answers.append(answer)
                self._progress.set()
                await asyncio.sleep(0)  # yield even when the transport never suspends

    async def _one(
        self, client: httpx.AsyncClient, headers: dict[str, str], number: int, started: float
    ) -> Answer:
        stream = number % 2 == 0
        words = " ".join(f"w{(number * 7 + k) % 997}" for k in range(self.prompt_words))
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"request {number}: {words}"}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        url = f"{self.endpoint}/v1/chat/completions"
        if not stream:
            response = await client.post(url, json=body, headers=headers)
            ttft = self.clock() - started
            problem = _check_body(response, self.max_tokens)
            return self._answer(started, ttft, response.status_code, False, response, problem)
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
                return self._answer(started, None, response.status_code, True, response, problem)
            first: float | None = None
            done, tokens, problem = False, None, None
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
                if first is None and any(
                    c.get("delta", {}).get("content") for c in event.get("choices", [])
                ):
                    first = self.clock() - started
            if problem is None and not done:
                problem = "no [DONE]"
            if problem is None and first is None:
                problem = "no text in the stream"
            if problem is None and tokens != self.max_tokens:
                problem = f"{tokens} completion tokens, not {self.max_tokens}"
            return self._answer(started, first, 200, True, response, problem)

    def _answer(
        self,
        started: float,
        ttft_s: float | None,
        status: int,
        stream: bool,
        response: httpx.Response | None,
        problem: str | None,
    ) -> Answer:
        headers = response.headers if response is not None else {}
        return Answer(
            started_s=started - self._started,
            ttft_s=ttft_s,
            total_s=self.clock() - started,
            status=status,
            stream=stream,
            route=headers.get("x-firstlight-route"),
            region=headers.get("x-firstlight-region"),
            problem=problem,
        )


def _check_body(response: httpx.Response, max_tokens: int) -> str | None:
    """Why a non-streamed answer does not count as served, or ``None``."""
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    try:
        body = response.json()
        tokens = body["usage"]["completion_tokens"]
        text = body["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return f"malformed body: {type(exc).__name__}: {exc}"
    if not text:
        return "no text in the answer"
    if tokens != max_tokens:
        return f"{tokens} completion tokens, not {max_tokens}"
    return None
