"""Serving a request on this region's own replicas, and writing the response.

:class:`LocalServer` is built by :class:`~firstlight.api.gateway.GatewayCore` and called
for every request the region decision keeps here (and every request a peer forwarded):
it sends the request through the model's request router, waits for the first token
(bounded by ``gateway.first_token_timeout_s``), records the route and its explanation,
then streams server-sent events or collects a JSON body. A replica that fails after
output started is resumed on another one, or in a peer region
(:mod:`firstlight.api.mid_stream`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi.responses import JSONResponse, Response, StreamingResponse

from firstlight.api._route_record import observe_first_token, route_info
from firstlight.api.advice import prompt_sample, with_usage
from firstlight.api.mid_stream import Elsewhere, MidStreamResumer
from firstlight.api.mid_stream import finish as _finish
from firstlight.api.migration import Attempts, merged_usage
from firstlight.api.rendered import rendered_body, rendered_events
from firstlight.api.responses import (
    DONE_EVENT,
    Kind,
    completion_body,
    error_body,
    error_response,
    sse_event,
    stream_chunk,
)
from firstlight.api.streams import (
    Stream,
    aclose,
    as_api_error,
    first_chunk,
    next_chunk,
)
from firstlight.config import ModelConfig, PlatformConfig
from firstlight.engine.protocol import (
    GenerationChunk,
    GenerationRequest,
    OpenAICall,
    RenderedChunk,
    Usage,
)
from firstlight.errors import ApiError, NoCapacityError
from firstlight.prefix import HashScheme
from firstlight.region.state import RouterState, ServedBy
from firstlight.region.ticket import Ticket
from firstlight.regions.hop import CallerClaim
from firstlight.regions.summary import HotPrefixes
from firstlight.routing import RequestView
from firstlight.telemetry import GatewayTelemetry, RequestObservation
from firstlight.telemetry.tracing import inject

__all__ = ["RETRY_AFTER_S", "TOKENS_FIELD", "Elsewhere", "LocalBackend", "LocalServer", "Prepared"]

_log = logging.getLogger(__name__)

RETRY_AFTER_S = 1.0
"""``Retry-After`` of refusals that have no better estimate."""

_Stream = AsyncIterator[ServedBy | GenerationChunk | RenderedChunk]

TOKENS_FIELD = "firstlight_token_ids"
"""Chunk field of a stream served for a peer gateway: the chunk's output token ids
(:mod:`firstlight.api.resume`)."""


class LocalBackend(Protocol):
    """The region's own model deployments, as the gateway uses them."""

    def state(self, model: str) -> RouterState | None:
        """The model's router state, ``None`` until its router exists."""
        ...

    def stream(
        self,
        model: str,
        request: GenerationRequest | OpenAICall,
        routing: RequestView,
        trace_context: dict[str, str],
    ) -> AsyncIterator[ServedBy | GenerationChunk | RenderedChunk]:
        """Send the request through the model's request router and stream what the
        replica yields: a :class:`ServedBy`, then the chunks (rendered by vLLM's OpenAI
        layer for an :class:`OpenAICall`). ``trace_context`` carries the route span to
        the replica (empty when traces are off)."""
        ...


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request ready for the region decision (made by ``RequestPreparer``)."""

    kind: Kind
    model: ModelConfig
    generation: GenerationRequest
    """What the gateway's own path sends the engine; for a request vLLM's layer serves
    (``openai``), its id (an embeddings request's carries no prompt)."""
    routing: RequestView
    stream: bool
    include_usage: bool
    openai: OpenAICall | None = None
    """Set when the request uses fields beyond the gateway's own subset: vLLM's OpenAI
    layer on the replica serves it (:mod:`firstlight.api.extended`)."""
    caller: CallerClaim | None = None
    """Who the gateway authenticated (its own client, or the caller a peer vouched for):
    signed into every forward of this request (:mod:`firstlight.regions.hop`)."""

    @property
    def served_name(self) -> str:
        """The ``model`` the client asked for and its response names: the LoRA adapter's
        name, or the model's."""
        lora = self.generation.lora
        return self.model.name if lora is None else lora.name


class LocalServer:
    """Serves requests on the region's replicas (see the module docstring)."""

    def __init__(
        self,
        config: PlatformConfig,
        region: str,
        backend: LocalBackend,
        telemetry: GatewayTelemetry,
        schemes: dict[str, HashScheme],
        hot: dict[str, HotPrefixes],
    ) -> None:
        self.config = config
        self.region = region
        self.backend = backend
        self.telemetry = telemetry
        self._schemes = schemes
        self._hot = hot
        self._resumer = MidStreamResumer(config, region, backend, telemetry, schemes)

    async def serve(
        self,
        prepared: Prepared,
        route: str,
        ticket: Ticket | None,
        obs: RequestObservation,
        reason: str,
        elsewhere: Elsewhere | None = None,
        token_ids: bool = False,
    ) -> Response:
        """Serve ``prepared`` here (``route`` and ``reason`` label it in headers and
        metrics; ``ticket`` is its route in this region, committed here: the transport
        executes its decision). ``elsewhere`` continues the
        request in a peer region if this one cannot (:meth:`_resume`); ``token_ids``
        (a peer forwarded the request) adds each streamed chunk's token ids
        (:data:`~firstlight.api.resume.TOKENS_FIELD`). Raises
        :class:`ReplicaFailedError` when the replica fails before any output (the gateway
        may try another), :class:`NoCapacityError` after ``first_token_timeout_s``."""
        local = ticket.estimate if ticket is not None else None
        predicted_ms = local.winner.predicted_ttft_ms if local is not None else None
        name = prepared.model.name
        span = self.telemetry.begin_route(obs, reason)
        started = time.monotonic()
        state = self.backend.state(name)
        if ticket is not None:
            ticket.commit()
        chunks = self.backend.stream(
            name, prepared.openai or prepared.generation, prepared.routing, inject(span)
        )
        timeout_s = self.config.gateway.first_token_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                served_by, first = await first_chunk(chunks)
        except TimeoutError:
            _finish(ticket)
            await aclose(chunks)
            raise NoCapacityError(
                f"no first token within {timeout_s:.0f} s", retry_after_s=RETRY_AFTER_S
            ) from None
        except BaseException:
            _finish(ticket)
            await aclose(chunks)
            raise
        ttft_ms = (time.monotonic() - started) * 1000.0
        routed = ticket.route if ticket is not None else None
        info = route_info(
            self.region, routed, prepared.generation.request_id, route, predicted_ms, served_by
        )
        # A marker that is not the first token (a JSON request with n > 1) times nothing:
        # no TTFT metric, and no calibration of the router from it.
        timed = not isinstance(first, RenderedChunk) or first.timed
        observe_first_token(
            self.region, self.telemetry, obs, info, routed, ttft_ms if timed else None
        )
        if prepared.kind != "embeddings":
            obs.prompt_sample = prompt_sample(prepared, obs.group, routed, state)
        if ticket is not None and timed:
            ticket.first_token(ttft_ms)
        self._hot[name].add(prepared.routing.block_hashes)
        headers = info.headers()
        if prepared.model.engine == "sim":
            headers["x-firstlight-simulated"] = "true"
        if isinstance(first, RenderedChunk):
            return await self._relay(prepared, first, chunks, obs, headers, ticket)
        if prepared.stream:
            return self.stream_response(
                prepared, first, chunks, obs, headers, elsewhere, token_ids, ticket
            )
        try:
            body = await self._collect(prepared, first, chunks, obs, elsewhere, ticket)
            return JSONResponse(body, headers=headers)
        except ApiError as exc:
            return error_response(exc, headers)

    def stream_response(
        self,
        prepared: Prepared,
        first: GenerationChunk,
        chunks: Stream,
        obs: RequestObservation,
        headers: dict[str, str],
        elsewhere: Elsewhere | None,
        token_ids: bool = False,
        ticket: Ticket | None = None,
    ) -> StreamingResponse:
        """The client's event stream from ``first`` and ``chunks`` (a local replica's, or
        a peer's read by :func:`~firstlight.api.resume.peer_chunks` — the forwarder calls
        this, without a ``ticket``), resumed elsewhere if its source fails mid-stream."""
        events = self._sse(prepared, first, chunks, obs, elsewhere, token_ids, ticket)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)

    async def _relay(
        self,
        prepared: Prepared,
        first: RenderedChunk,
        chunks: _Stream,
        obs: RequestObservation,
        headers: dict[str, str],
        ticket: Ticket | None,
    ) -> Response:
        """A response vLLM's OpenAI layer rendered, relayed (:mod:`firstlight.api.rendered`)."""

        def finish() -> None:
            _finish(ticket)

        if prepared.stream:
            events = rendered_events(first, chunks, obs, finish)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        return await rendered_body(first, chunks, obs, finish, headers)

    async def _collect(
        self,
        prepared: Prepared,
        first: GenerationChunk,
        chunks: Stream,
        obs: RequestObservation,
        elsewhere: Elsewhere | None,
        ticket: Ticket | None,
    ) -> dict[str, Any]:
        parts, last = [first.text], first
        generated = list(first.token_ids)
        attempts = Attempts(self.config.gateway.max_attempts)
        try:
            chunk: GenerationChunk | None = first
            while chunk is not None and chunk.finish_reason is None:
                try:
                    chunk = await next_chunk(chunks)
                except Exception as exc:
                    chunks, chunk, ticket = await self._resumer.resume(
                        prepared, generated, chunks, exc, attempts, elsewhere, ticket
                    )
                if chunk is not None:
                    parts.append(chunk.text)
                    generated.extend(chunk.token_ids)
                    last = chunk
        except Exception as exc:
            raise as_api_error(exc) from exc
        finally:
            _finish(ticket)
            await aclose(chunks)
        usage = last.usage
        if attempts.used > 1:
            usage = merged_usage(usage, prepared.routing.prompt_tokens, len(generated))
        obs.completed(usage.completion_tokens if usage else len(generated))
        obs.prompt_sample = with_usage(obs.prompt_sample, usage)
        return completion_body(
            prepared.kind,
            prepared.generation.response_id,
            prepared.served_name,
            int(time.time()),
            "".join(parts),
            last.finish_reason,
            usage,
        )

    async def _sse(
        self,
        prepared: Prepared,
        first: GenerationChunk,
        chunks: Stream,
        obs: RequestObservation,
        elsewhere: Elsewhere | None,
        token_ids: bool,
        ticket: Ticket | None,
    ) -> AsyncIterator[bytes]:
        kind, rid, name = prepared.kind, prepared.generation.response_id, prepared.served_name
        created = int(time.time())
        usage: Usage | None = None
        generated: list[int] = []
        attempts = Attempts(self.config.gateway.max_attempts)
        try:
            chunk: GenerationChunk | None = first
            is_first = True
            while chunk is not None:
                generated.extend(chunk.token_ids)
                obs.streamed(len(chunk.token_ids))
                event = stream_chunk(
                    kind, rid, name, created, chunk.text, chunk.finish_reason, first=is_first
                )
                if token_ids:
                    event[TOKENS_FIELD] = list(chunk.token_ids)
                yield sse_event(event)
                is_first = False
                usage = chunk.usage or usage
                if chunk.finish_reason is not None:
                    break
                try:
                    chunk = await next_chunk(chunks)
                except Exception as exc:  # the replica failed: resume elsewhere, or raise
                    chunks, chunk, ticket = await self._resumer.resume(
                        prepared, generated, chunks, exc, attempts, elsewhere, ticket
                    )
            if attempts.used > 1:
                usage = merged_usage(usage, prepared.routing.prompt_tokens, len(generated))
            obs.prompt_sample = with_usage(obs.prompt_sample, usage)
            if prepared.include_usage and usage is not None:
                yield sse_event(stream_chunk(kind, rid, name, created, None, usage=usage))
        except Exception as exc:  # after the headers went out: an error event, then DONE
            error = as_api_error(exc)
            obs.ended(error.status)
            yield sse_event(error_body(error))
        finally:
            _finish(ticket)
            await aclose(chunks)
        yield DONE_EVENT
