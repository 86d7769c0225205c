"""The closed loop's sender over the official ``openai`` client, with its retries: what
an application developer's client sees.

Who calls what: :func:`firstlight_bench.tools.serving_gateways.kill_one_gateway` runs a
:class:`~firstlight_bench.clients.closed_loop.ClosedLoop` through an :class:`OpenAISender` beside
one through :class:`~firstlight_bench.clients.closed_loop.HttpxSender` (plain httpx, no retries)
while it kills a gateway. The official client sends a request again when it failed to
connect or got no response, or got a 408/409/429 or a 5xx (twice by default, after a
short back-off). An answer counts only with exactly ``max_tokens`` completion tokens
(streamed: from its usage chunk; tokens it counted but no text showed were seen at the
stream's end); any exception the client raises after its retries loses the request.
The loop's deadline bounds a request with all its retries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import httpx2
import openai

from firstlight_bench.clients.closed_loop import ChatRequest, Clock, Reply, Send, token_count

__all__ = ["OpenAISender"]


@dataclass(frozen=True, slots=True)
class OpenAISender:
    """One ``openai.AsyncOpenAI`` against ``endpoint`` (a region's base URL, ``/v1``
    below it) for all the loop's clients, with its retries (module docstring)."""

    endpoint: str
    api_key: str = "none"
    max_retries: int = 2
    """The official client's default."""
    http_client: httpx2.AsyncClient | None = None
    """The official client's HTTP client (tests pass one on ``httpx2.MockTransport``:
    the official client is built on ``httpx2``); ``None``: its own."""

    @asynccontextmanager
    async def connect(
        self, clients: int, deadline_s: float, clock: Clock
    ) -> AsyncIterator[Sequence[Send]]:
        client = openai.AsyncOpenAI(
            base_url=f"{self.endpoint}/v1",
            api_key=self.api_key,
            max_retries=self.max_retries,
            timeout=deadline_s,
            http_client=self.http_client,
        )
        try:
            yield [partial(self._send, client, clock)] * clients
        finally:
            await client.close()

    async def _send(self, client: openai.AsyncOpenAI, clock: Clock, request: ChatRequest) -> Reply:
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": request.content}
        ]
        wanted = request.max_tokens
        try:
            if not request.stream:
                reply = await client.chat.completions.create(
                    model=request.model, messages=messages, max_tokens=wanted, temperature=0
                )
                usage = reply.usage
                tokens = usage.completion_tokens if usage else None
                if not reply.choices:
                    return Reply(None, problem="no choices")
                if tokens != wanted or not reply.choices[0].message.content:
                    return Reply(None, problem=f"{tokens} completion tokens, not {wanted}")
                return Reply(
                    clock(), token_count(usage and usage.prompt_tokens), token_count(tokens)
                )
            stream = await client.chat.completions.create(
                model=request.model,
                messages=messages,
                max_tokens=wanted,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            first: float | None = None
            usage = None
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                if first is None and any(c.delta.content for c in chunk.choices):
                    first = clock()
        except openai.OpenAIError as exc:
            return Reply(None, problem=f"{type(exc).__name__}: {exc}")
        tokens = usage.completion_tokens if usage else None
        if first is None and tokens == wanted:  # counted but never shown: seen at the end
            first = clock()
        prompt = token_count(usage and usage.prompt_tokens)
        return Reply(first, prompt, token_count(tokens), problem=request.wrong_length(tokens))
