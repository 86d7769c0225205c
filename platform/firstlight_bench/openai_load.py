"""Steady closed-loop load from the official ``openai`` client, with its default retries.

Who calls what: :func:`firstlight_bench.serving_gateways.kill_one_gateway` runs it beside
:class:`~firstlight_bench.steady.SteadyLoad` (plain httpx, no retries) while it kills a
gateway: what an application developer's client sees, since the official client retries
a request that failed to connect or got no response, a 408/409/429 or a 5xx (twice by
default, with a short back-off). The interface is :class:`SteadyLoad`'s (``start``,
``wait_for``, ``now_s``, ``stop``, ``answers``), and so are the checks: streamed and
non-streamed requests alternate, an answer counts only with exactly ``max_tokens``
completion tokens and, streamed, its usage chunk; any exception the client raises after
its retries makes the request *lost*.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx2
import openai

from firstlight_bench.steady import Answer

__all__ = ["OpenAILoad"]


@dataclass
class OpenAILoad:
    """``clients`` closed-loop clients of one ``openai.AsyncOpenAI`` against ``endpoint``
    (a region's base URL, ``/v1`` below it)."""

    endpoint: str
    model: str
    clients: int = 4
    max_tokens: int = 16
    prompt_words: int = 40
    api_key: str = "none"
    max_retries: int = 2
    """The official client's default."""
    deadline_s: float = 120.0
    answers: list[Answer] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic
    http_client: httpx2.AsyncClient | None = None
    """The official client's HTTP client (tests pass one on ``httpx2.MockTransport``:
    the official client is built on ``httpx2``); ``None``: its own."""
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _started: float = 0.0
    _sent: int = 0
    _progress: asyncio.Event = field(default_factory=asyncio.Event)
    _openai: openai.AsyncOpenAI | None = None

    def start(self) -> None:
        """Start the clients (on the running event loop)."""
        self._started = self.clock()
        client = openai.AsyncOpenAI(
            base_url=f"{self.endpoint}/v1",
            api_key=self.api_key,
            max_retries=self.max_retries,
            timeout=self.deadline_s,
            http_client=self.http_client,
        )
        self._openai = client
        self._tasks = [asyncio.create_task(self._client(client)) for _ in range(self.clients)]

    def now_s(self) -> float:
        """Seconds since :meth:`start` (the answers' time base)."""
        return self.clock() - self._started

    async def wait_for(self, count: int, within_s: float = 120.0) -> None:
        """Until ``count`` answers are in; ``TimeoutError`` after ``within_s``."""
        async with asyncio.timeout(within_s):
            while len(self.answers) < count:
                self._progress.clear()
                await self._progress.wait()

    async def stop(self) -> list[Answer]:
        """Let every client finish its current request, then return all answers."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        if self._openai is not None:
            await self._openai.close()
        return self.answers

    async def _client(self, client: openai.AsyncOpenAI) -> None:
        while not self._stop.is_set():
            number = self._sent
            self._sent += 1
            started = self.clock()
            ttft: float | None = None
            problem: str | None = None
            try:
                ttft, problem = await self._one(client, number, started)
            except openai.OpenAIError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            self.answers.append(
                Answer(
                    started_s=started - self._started,
                    ttft_s=ttft,
                    total_s=self.clock() - started,
                    status=200 if problem is None else 0,
                    stream=number % 2 == 0,
                    route=None,
                    region=None,
                    problem=problem,
                )
            )
            self._progress.set()
            await asyncio.sleep(0)  # yield even when the transport never suspends

    async def _one(
        self, client: openai.AsyncOpenAI, number: int, started: float
    ) -> tuple[float | None, str | None]:
        """(TTFT, problem) of one request; raises what the client raises."""
        words = " ".join(f"w{(number * 7 + k) % 997}" for k in range(self.prompt_words))
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": f"request {number}: {words}"}
        ]
        if number % 2:
            reply = await client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=0
            )
            tokens = reply.usage.completion_tokens if reply.usage else None
            if not reply.choices:
                return None, "no choices"
            if tokens != self.max_tokens or not reply.choices[0].message.content:
                return None, f"{tokens} completion tokens, not {self.max_tokens}"
            return self.clock() - started, None
        stream = await client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=self.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        first: float | None = None
        tokens = None
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            if first is None and any(c.delta.content for c in chunk.choices):
                first = self.clock() - started
        if tokens != self.max_tokens:
            return first, f"{tokens} completion tokens, not {self.max_tokens}"
        return first, None
