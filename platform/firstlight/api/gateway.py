"""The regional gateway's request handling, and the region decision.

:class:`GatewayCore` is built once per gateway replica by the Ray Serve ingress
deployment (:class:`firstlight.serve.gateway_deployment.Gateway`), which hands it a
:class:`LocalBackend` (the region's model deployments, through Ray handles), a
:class:`~firstlight.regions.PeerTable` and the process's
:class:`~firstlight.telemetry.GatewayTelemetry`; :mod:`firstlight.api.routes` puts HTTP
routes over it. Per request, on the event loop:

``auth → validate → tokenize (+ block hashes) → region decision → local or peer → respond``

Peers are reached through :mod:`firstlight.api.forward`; replica streams are read with
:mod:`firstlight.api.streams`. Every request fills a telemetry observation (route, first
token, tokens, status) that ends in metrics, the request's trace and the dashboard.

The region decision: a forwarded request (hop header) is always served here; with no
healthy local replica the request **fails over** to the usable peer with the lowest
predicted TTFT; otherwise it **spills over** when that peer's prediction (round trip
included) beats the local one by ``router.spill_over_margin_ms``. A peer that fails is
skipped (its breaker counts it) and the next one is tried; when nothing can take the
request the answer is 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import trace
from pydantic import ValidationError

from firstlight.api.auth import ApiKeys
from firstlight.api.forward import HOP_HEADER, PeerForwarder
from firstlight.api.migration import Attempts, continuation, merged_usage
from firstlight.api.prompts import PromptEncoder
from firstlight.api.responses import (
    DONE_EVENT,
    Kind,
    completion_body,
    error_body,
    error_response,
    sse_event,
    stream_chunk,
)
from firstlight.api.schemas import ChatCompletionRequest, CompletionRequest
from firstlight.api.streams import (
    ReplicaFailedError,
    Stream,
    aclose,
    as_api_error,
    cause,
    first_chunk,
    next_chunk,
)
from firstlight.config import ModelConfig, PlatformConfig
from firstlight.dashboard import dashboard_state
from firstlight.engine.protocol import (
    GenerationChunk,
    GenerationRequest,
    SamplingSettings,
    Usage,
)
from firstlight.errors import (
    ApiError,
    BadRequestError,
    ModelNotServedError,
    NoCapacityError,
    RateLimitedError,
    RequestTooLargeError,
)
from firstlight.prefix import HashScheme, hint_hashes
from firstlight.regions.peers import Peer, PeerTable
from firstlight.regions.summary import HotPrefixes, ModelSummary, RegionSummary, spills_over
from firstlight.routing import Decision, RequestView
from firstlight.serve.router_state import Route, RouterState, ServedBy
from firstlight.telemetry import GatewayTelemetry, RequestObservation
from firstlight.telemetry.tracing import inject

__all__ = ["HOP_HEADER", "GatewayCore", "LocalBackend"]  # HOP_HEADER: from .forward

_log = logging.getLogger(__name__)

_RETRY_AFTER_S = 1.0


_Stream = AsyncIterator[ServedBy | GenerationChunk]


class LocalBackend(Protocol):
    """The region's own model deployments, as the gateway uses them."""

    def state(self, model: str) -> RouterState | None:
        """The model's router state, ``None`` until its router exists."""
        ...

    def stream(
        self,
        model: str,
        request: GenerationRequest,
        routing: RequestView,
        trace_context: dict[str, str],
    ) -> AsyncIterator[ServedBy | GenerationChunk]:
        """Send the request through the model's request router and stream what the
        replica yields: a :class:`ServedBy`, then the chunks. ``trace_context`` carries
        the route span to the replica (empty when traces are off)."""
        ...


@dataclass(frozen=True, slots=True)
class _Prepared:
    kind: Kind
    model: ModelConfig
    generation: GenerationRequest
    routing: RequestView
    stream: bool
    include_usage: bool


@dataclass(frozen=True, slots=True)
class _RouteInfo:
    route: str
    region: str
    replica: str
    predicted_ms: float | None
    explanation: str | None = None

    def headers(self) -> dict[str, str]:
        out = {
            "x-firstlight-route": self.route,
            "x-firstlight-region": self.region,
            "x-firstlight-replica": self.replica,
        }
        if self.predicted_ms is not None:
            out["x-firstlight-predicted-ttft-ms"] = f"{self.predicted_ms:.1f}"
        if self.explanation is not None:
            out["x-firstlight-decision"] = self.explanation
        return out


class GatewayCore:
    """Request handling of one region's gateway (see the module docstring)."""

    def __init__(
        self,
        config: PlatformConfig,
        region: str,
        backend: LocalBackend,
        encoders: Mapping[str, PromptEncoder],
        peers: PeerTable,
        client: httpx.AsyncClient,
        telemetry: GatewayTelemetry,
    ) -> None:
        self.config = config
        self.telemetry = telemetry
        self.region = region
        self.backend = backend
        self.encoders = encoders
        self.peers = peers
        self.keys = ApiKeys(config.auth)
        self._client = client
        self._models = {m.name: m for m in config.models}
        self._schemes = {m.name: HashScheme.for_model(m, config.hints) for m in config.models}
        self._hot = {m.name: HotPrefixes() for m in config.models}
        self._forwarder = PeerForwarder(region, peers, client, telemetry)
        self._created = int(time.time())
        self._inflight: dict[str, int] = {}

    # --- entry points (called by the FastAPI routes) ------------------------------------

    async def completions(self, kind: Kind, request: Request) -> Response:
        """``POST /v1/chat/completions`` (``kind="chat"``) and ``/v1/completions``."""
        obs = self.telemetry.start(kind, request.headers)
        try:
            caller = self.keys.check(request.headers.get("authorization"))
        except ApiError as exc:
            return self._refused(obs, exc)
        limit = self.config.gateway.max_concurrent_per_key
        if self._inflight.get(caller, 0) >= limit:
            return self._refused(
                obs,
                RateLimitedError(
                    f"too many concurrent requests for this API key (limit {limit})",
                    code="rate_limit_exceeded",
                    retry_after_s=_RETRY_AFTER_S,
                ),
            )
        self._inflight[caller] = self._inflight.get(caller, 0) + 1
        response: Response | None = None
        try:
            body = await _read_body(request, self.config.gateway.max_body_bytes)
            prepared = self._prepare(kind, body)
            obs.model = prepared.model.name
            obs.request_id = prepared.generation.request_id
            obs.input_tokens = prepared.routing.prompt_tokens
            hop = request.headers.get(HOP_HEADER) is not None
            response = await self._dispatch(prepared, body, request, hop, obs)
        except ApiError as exc:
            response = error_response(exc)
        except asyncio.CancelledError:
            obs.status = CLIENT_CLOSED  # the client went away: not a server error
            raise
        finally:
            if response is None or not isinstance(response, StreamingResponse):
                self._release(caller)
                if response is not None:
                    obs.status = response.status_code
                elif obs.status == 200:
                    obs.status = 500
                self.telemetry.finish(obs)
        if isinstance(response, StreamingResponse):

            def release() -> None:
                self._release(caller)
                self.telemetry.finish(obs)

            done = _once(release)
            response = _ClosingStream(response, _closed_after(response.body_iterator, done), done)
        return response

    def _refused(self, obs: RequestObservation, exc: ApiError) -> Response:
        obs.status = exc.status
        self.telemetry.finish(obs)
        return error_response(exc)

    def _release(self, caller: str) -> None:
        left = self._inflight.get(caller, 1) - 1
        if left > 0:
            self._inflight[caller] = left
        else:
            self._inflight.pop(caller, None)

    def models(self, request: Request) -> Response:
        try:
            self.keys.check(request.headers.get("authorization"))
        except ApiError as exc:
            return error_response(exc)
        data = [
            {
                "id": m.name,
                "object": "model",
                "created": self._created,
                "owned_by": "firstlight",
                "max_model_len": m.max_model_len,
                "simulated": m.engine == "sim",
            }
            for m in self.config.models
        ]
        return JSONResponse({"object": "list", "data": data})

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when every model has a healthy local replica."""
        replicas, hints, fallbacks = {}, {}, {}
        for name in self._models:
            state = self.backend.state(name)
            replicas[name] = 0 if state is None else state.healthy_replicas
            fallbacks[name] = 0 if state is None else state.fallbacks
            hints[name] = {
                "status": "off" if state is None else state.hints_status(),
                "blocks": 0 if state is None else state.hint_blocks(),
            }
        ready = all(n > 0 for n in replicas.values())
        detail = {"region": self.region, "replicas": replicas, "hints": hints}
        return ready, {**detail, "routing_fallbacks": fallbacks}

    def summary(self) -> RegionSummary:
        """This region's summary for its peers (``GET /v1/firstlight/summary``)."""
        models = {}
        for name in self._models:
            state = self.backend.state(name)
            hot = self._hot[name].snapshot()
            models[name] = ModelSummary(0, 0.0, 0.0) if state is None else state.summary(hot)
        return RegionSummary(self.region, time.time(), models)

    def dashboard_state(self) -> dict[str, Any]:
        """The built-in dashboard's data (``GET /dashboard/api/state``)."""
        states = {name: self.backend.state(name) for name in self._models}
        return dashboard_state(
            self.config, self.region, states, self.peers, self.summary(), self.telemetry
        )

    # --- request preparation ------------------------------------------------------------

    def _prepare(self, kind: Kind, body: bytes) -> _Prepared:
        try:
            raw = json.loads(body)
        except ValueError as exc:
            raise BadRequestError(f"the body is not valid JSON: {exc}") from exc
        schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
        try:
            parsed: ChatCompletionRequest | CompletionRequest = schema.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            param = ".".join(str(p) for p in err["loc"]) or None
            raise BadRequestError(f"{param}: {err['msg']}", param=param) from exc
        model = self._models.get(parsed.model)
        if model is None:
            raise ModelNotServedError(
                f"the model {parsed.model!r} does not exist here; "
                f"served models: {', '.join(self._models)}",
                param="model",
                code="model_not_found",
            )
        limits = self.config.gateway
        encoder = self.encoders[model.name]
        if isinstance(parsed, ChatCompletionRequest):
            if len(parsed.messages) > limits.max_messages:
                raise BadRequestError(
                    f"{len(parsed.messages)} messages; at most {limits.max_messages} are "
                    "accepted (gateway.max_messages)",
                    param="messages",
                )
            prompt = encoder.chat(parsed.messages)
        elif isinstance(parsed.prompt, str):
            prompt = encoder.text(parsed.prompt)
        else:
            prompt = tuple(parsed.prompt)
        if limits.max_prompt_tokens is not None and len(prompt) > limits.max_prompt_tokens:
            raise BadRequestError(
                f"the prompt has {len(prompt)} tokens; at most {limits.max_prompt_tokens} are "
                "accepted (gateway.max_prompt_tokens)",
                param="messages" if kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        room = model.max_model_len - len(prompt)
        if limits.max_output_tokens is not None:
            room = min(room, limits.max_output_tokens)
        max_tokens = parsed.requested_max_tokens
        if (
            limits.max_output_tokens is not None
            and max_tokens is not None
            and max_tokens > limits.max_output_tokens
        ):
            raise BadRequestError(
                f"max_tokens is {max_tokens}; at most {limits.max_output_tokens} are accepted "
                "(gateway.max_output_tokens)",
                param="max_tokens",
            )
        if room < 1 or (max_tokens is not None and max_tokens > room):
            asked = max_tokens if max_tokens is not None else 1
            raise BadRequestError(
                f"this model's maximum context length is {model.max_model_len} tokens; "
                f"the prompt has {len(prompt)} tokens and {asked} more were requested",
                param="messages" if kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        sampling = SamplingSettings(
            max_tokens=max_tokens if max_tokens is not None else room,
            temperature=parsed.temperature,
            top_p=parsed.top_p,
            seed=parsed.seed,
            stop=parsed.stop_sequences(),
        )
        scheme = self._schemes[model.name]
        routing = RequestView(
            request_id=request_id,
            prompt_tokens=len(prompt),
            block_hashes=hint_hashes(prompt, scheme),
            block_size=scheme.block_size,
        )
        return _Prepared(
            kind,
            model,
            GenerationRequest(request_id, prompt, sampling),
            routing,
            parsed.stream,
            parsed.include_usage,
        )

    # --- the region decision ------------------------------------------------------------

    async def _dispatch(
        self, prepared: _Prepared, body: bytes, request: Request, hop: bool, obs: RequestObservation
    ) -> Response:
        state = self.backend.state(prepared.model.name)
        local = state.estimate(prepared.routing) if state is not None else None
        # No router state yet means Ray has not told us of any replica.
        healthy = state is not None and state.healthy_replicas > 0
        if hop:
            if not healthy:
                raise NoCapacityError(
                    f"no healthy replica of {prepared.model.name!r} in region {self.region}",
                    retry_after_s=_RETRY_AFTER_S,
                )
            return await self._serve_local(prepared, "local", local, obs, "from_peer")
        ranked = self._forwarder.rank(prepared.model.name, prepared.routing, _ms_per_token(local))
        if not healthy:
            return await self._fail_over(ranked, prepared, body, request, obs)
        best_peer_ms = ranked[0][1] if ranked else None
        if spills_over(local, best_peer_ms, self.config.router.spill_over_margin_ms):
            spilled = await self._forwarder.forward_any(
                ranked,
                body,
                request,
                "spill-over",
                obs,
                prepared.stream,
                prepared.routing.prompt_tokens,
                local,
            )
            if spilled is not None:
                return spilled
        attempts = Attempts(self.config.gateway.max_attempts)
        while True:
            try:
                return await self._serve_local(prepared, "local", local, obs, "local")
            except ReplicaFailedError as exc:
                _log.warning("%s: local attempt failed before any output: %s", self.region, exc)
                if obs.route_span is not None:
                    obs.route_span.set_status(trace.StatusCode.ERROR, str(exc))
                if state is None or state.healthy_replicas == 0 or not attempts.another(str(exc)):
                    return await self._fail_over(ranked, prepared, body, request, obs)
                local = state.estimate(prepared.routing)  # another replica, knowing this

    async def _fail_over(
        self,
        ranked: list[tuple[Peer, float]],
        prepared: _Prepared,
        body: bytes,
        request: Request,
        obs: RequestObservation,
    ) -> Response:
        response = await self._forwarder.forward_any(
            ranked, body, request, "fail-over", obs, prepared.stream, prepared.routing.prompt_tokens
        )
        if response is not None:
            return response
        raise NoCapacityError(
            f"no healthy replica of {prepared.model.name!r} in region {self.region} "
            "and no peer region could take the request",
            retry_after_s=_RETRY_AFTER_S,
        )

    # --- serving locally ----------------------------------------------------------------

    async def _serve_local(
        self,
        prepared: _Prepared,
        route: str,
        local: Decision | None,
        obs: RequestObservation,
        reason: str,
    ) -> Response:
        predicted_ms = local.winner.predicted_ttft_ms if local is not None else None
        name = prepared.model.name
        request_id = prepared.generation.request_id
        span = self.telemetry.begin_route(obs, reason)
        started = time.monotonic()
        state = self.backend.state(name)
        if state is not None:
            cached = local.winner.cached_blocks * prepared.routing.block_size if local else 0
            state.dispatched(request_id, max(prepared.routing.prompt_tokens - cached, 1))
        chunks = self.backend.stream(name, prepared.generation, prepared.routing, inject(span))
        timeout_s = self.config.gateway.first_token_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                served_by, first = await first_chunk(chunks)
        except TimeoutError:
            self._finish(name, request_id)
            await aclose(chunks)
            raise NoCapacityError(
                f"no first token within {timeout_s:.0f} s", retry_after_s=_RETRY_AFTER_S
            ) from None
        except BaseException:
            self._finish(name, request_id)
            await aclose(chunks)
            raise
        ttft_ms = (time.monotonic() - started) * 1000.0
        info = self._route_info(state, request_id, route, predicted_ms, served_by)
        routed = state.route_of(request_id) if state is not None else None
        self._observe_first_token(obs, info, routed, ttft_ms)
        if state is not None:
            state.first_token(request_id, ttft_ms)
        self._hot[name].add(prepared.routing.block_hashes)
        headers = info.headers()
        if prepared.model.engine == "sim":
            headers["x-firstlight-simulated"] = "true"
        if prepared.stream:
            events = self._sse(prepared, first, chunks, obs)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        try:
            body = await self._collect(prepared, first, chunks, obs)
            return JSONResponse(body, headers=headers)
        except ApiError as exc:
            return error_response(exc, headers)

    def _observe_first_token(
        self, obs: RequestObservation, info: _RouteInfo, routed: Route | None, ttft_ms: float
    ) -> None:
        """Metrics, the route span's decision terms and the dashboard's decision log."""
        obs.served_region, obs.replica = self.region, info.replica
        obs.predicted_ttft_ms, obs.explanation = info.predicted_ms, info.explanation
        obs.observed_ttft_ms = ttft_ms  # from dispatch, as the prediction
        span = obs.route_span
        chosen = routed.chosen if routed is not None else None
        if span is not None and span.is_recording():
            span.set_attribute("firstlight.replica", info.replica)
            if info.predicted_ms is not None:
                span.set_attribute("firstlight.predicted_ttft_ms", info.predicted_ms)
            span.set_attribute("firstlight.observed_ttft_ms", ttft_ms)
            if chosen is not None and chosen.terms is not None:
                for term in ("rtt_ms", "wait_ms", "prefill_ms", "overhead_ms"):
                    span.set_attribute(f"firstlight.terms.{term}", getattr(chosen.terms, term))
                span.set_attribute("firstlight.cached_tokens", chosen.terms.cached_tokens)
                span.set_attribute("firstlight.uncached_tokens", chosen.terms.uncached_tokens)
            if routed is not None and len(routed.decision.ranked) > 1:
                runner_up = routed.decision.ranked[1]
                span.set_attribute("firstlight.runner_up", runner_up.replica_id)
                if runner_up.predicted_ttft_ms is not None:
                    span.set_attribute("firstlight.runner_up_ttft_ms", runner_up.predicted_ttft_ms)
        obs.first_token()
        self.telemetry.routed(
            obs.model,
            routed.decision_s if routed is not None else None,
            info.predicted_ms,
            ttft_ms,
        )

    def _route_info(
        self,
        state: RouterState | None,
        request_id: str,
        route: str,
        predicted: float | None,
        served_by: str,
    ) -> _RouteInfo:
        routed = state.route_of(request_id) if state is not None else None
        if routed is None or routed.chosen is None:
            return _RouteInfo(route, self.region, served_by, predicted)
        chosen = routed.chosen
        if chosen.replica_id != served_by:
            _log.warning(
                "%s: %s was routed to %s but served by %s",
                self.region,
                request_id,
                chosen.replica_id,
                served_by,
            )
            return _RouteInfo(route, self.region, served_by, None)
        terms_ms = chosen.terms.total_ms if chosen.terms is not None else predicted
        explanation = routed.decision.explain().encode("ascii", "replace").decode()
        return _RouteInfo(route, self.region, chosen.replica_id, terms_ms, explanation)

    def _finish(self, model: str, request_id: str) -> None:
        state = self.backend.state(model)
        if state is not None:
            state.finished(request_id)

    async def _resume(
        self,
        prepared: _Prepared,
        generated: list[int],
        failed: Stream,
        exc: Exception,
        attempts: Attempts,
    ) -> tuple[Stream, GenerationChunk]:
        """Continue a request whose replica failed after ``generated`` tokens on another
        replica (:mod:`firstlight.api.migration`); return the new stream and its first
        chunk. Raises ``exc`` when migration is off, :class:`NoCapacityError` when the
        attempts are used up."""
        name, rid = prepared.model.name, prepared.generation.request_id
        self._finish(name, rid)
        await aclose(failed)
        if not self.config.gateway.stream_migration:
            raise exc
        reason = f"{type(cause(exc)).__name__}: {cause(exc)}"
        timeout_s = self.config.gateway.first_token_timeout_s
        while attempts.another(reason):
            request, routing = continuation(prepared.generation, generated, self._schemes[name])
            _log.warning(
                "%s: %s resumed after %d tokens (attempt %d): %s",
                self.region,
                rid,
                len(generated),
                attempts.used,
                reason,
            )
            state = self.backend.state(name)
            if state is not None:
                state.dispatched(rid, routing.prompt_tokens)
            chunks = self.backend.stream(name, request, routing, {})
            try:
                async with asyncio.timeout(timeout_s):
                    _, first = await first_chunk(chunks)
            except (ReplicaFailedError, TimeoutError) as again:
                reason = str(again) or type(again).__name__
                self._finish(name, rid)
                await aclose(chunks)
                continue
            except BaseException:
                self._finish(name, rid)
                await aclose(chunks)
                raise
            return chunks, first
        raise NoCapacityError(
            f"the request failed mid-stream and could not be resumed: {attempts.summary()}"
        ) from exc

    async def _collect(
        self, prepared: _Prepared, first: GenerationChunk, chunks: Stream, obs: RequestObservation
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
                    chunks, chunk = await self._resume(prepared, generated, chunks, exc, attempts)
                if chunk is not None:
                    parts.append(chunk.text)
                    generated.extend(chunk.token_ids)
                    last = chunk
        except Exception as exc:
            raise as_api_error(exc) from exc
        finally:
            self._finish(prepared.model.name, prepared.generation.request_id)
            await aclose(chunks)
        obs.last_token_at = time.monotonic()
        usage = last.usage
        if attempts.used > 1:
            usage = merged_usage(usage, prepared.routing.prompt_tokens, len(generated))
        obs.output_tokens = usage.completion_tokens if usage else len(generated)
        return completion_body(
            prepared.kind,
            prepared.generation.request_id,
            prepared.model.name,
            int(time.time()),
            "".join(parts),
            last.finish_reason,
            usage,
        )

    async def _sse(
        self, prepared: _Prepared, first: GenerationChunk, chunks: Stream, obs: RequestObservation
    ) -> AsyncIterator[bytes]:
        kind, rid, name = prepared.kind, prepared.generation.request_id, prepared.model.name
        created = int(time.time())
        usage: Usage | None = None
        obs.output_tokens = 0
        generated: list[int] = []
        attempts = Attempts(self.config.gateway.max_attempts)
        try:
            chunk: GenerationChunk | None = first
            is_first = True
            while chunk is not None:
                generated.extend(chunk.token_ids)
                obs.output_tokens += len(chunk.token_ids)
                obs.last_token_at = time.monotonic()
                yield sse_event(
                    stream_chunk(
                        kind, rid, name, created, chunk.text, chunk.finish_reason, first=is_first
                    )
                )
                is_first = False
                usage = chunk.usage or usage
                if chunk.finish_reason is not None:
                    break
                try:
                    chunk = await next_chunk(chunks)
                except Exception as exc:  # the replica failed: resume elsewhere, or raise
                    chunks, chunk = await self._resume(prepared, generated, chunks, exc, attempts)
            if attempts.used > 1:
                usage = merged_usage(usage, prepared.routing.prompt_tokens, len(generated))
            if prepared.include_usage and usage is not None:
                yield sse_event(stream_chunk(kind, rid, name, created, None, usage=usage))
        except Exception as exc:  # after the headers went out: an error event, then DONE
            error = as_api_error(exc)
            obs.status = error.status
            yield sse_event(error_body(error))
        finally:
            self._finish(name, rid)
            await aclose(chunks)
        yield DONE_EVENT


def _ms_per_token(decision: Decision | None) -> float | None:
    """The calibrated prefill cost of the local winner, ``None`` if unknown."""
    if decision is None or decision.winner.terms is None:
        return None
    terms = decision.winner.terms
    return terms.prefill_ms / max(terms.uncached_tokens, 1)


CLIENT_CLOSED = 499
"""Status recorded when the client disconnects before the response (nginx's convention)."""


def _once(action: Callable[[], object]) -> Callable[[], None]:
    """``action``, run at most once however often the result is called."""
    pending = [action]

    def run() -> None:
        while pending:
            pending.pop()()

    return run


async def _closed_after(body: AsyncIterable[Any], done: Callable[[], None]) -> AsyncIterator[Any]:
    try:
        async for piece in body:
            yield piece
    finally:
        done()


class _ClosingStream(StreamingResponse):
    """A streaming response that runs ``done`` when the ASGI exchange ends, also when the
    body was never iterated (the client left before the headers went out): the per-key
    slot and the request's telemetry are released either way."""

    def __init__(
        self, inner: StreamingResponse, body: AsyncIterable[Any], done: Callable[[], None]
    ) -> None:
        super().__init__(body, status_code=inner.status_code, headers=dict(inner.headers))
        self._done = done

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done()


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(f"the request body exceeds {limit} bytes")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise RequestTooLargeError(f"the request body exceeds {limit} bytes")
    return bytes(body)
