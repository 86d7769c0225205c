"""The regional gateway's request handling, and the region decision.

:class:`GatewayCore` is built once per gateway replica by the Ray Serve ingress
deployment (:class:`firstlight.serve.gateway_deployment.Gateway`), which hands it a
:class:`LocalBackend` (the region's model deployments, through Ray handles), a
:class:`~firstlight.regions.PeerTable` and the process's
:class:`~firstlight.telemetry.GatewayTelemetry`; :mod:`firstlight.api.routes` puts HTTP
routes over it. Per request, on the event loop:

``auth → validate → tokenize (+ block hashes) → region decision → local or peer → respond``

Validation, bounds and tokenizing are :class:`~firstlight.api.prepare.RequestPreparer`'s;
the region decision is :func:`firstlight.region.decide_region`, which this module carries
out; the response plumbing is :mod:`firstlight.api.plumbing`.

The decision is carried out by :class:`~firstlight.api.dispatch.Dispatcher`: peers are
reached through :mod:`firstlight.api.forward`; requests kept here are served by
:class:`~firstlight.api.in_region.LocalServer` (:mod:`firstlight.api.in_region`). Every
request fills a telemetry observation (route, first token, tokens, status) that ends in
metrics, the request's trace and the dashboard.

Admission: more than ``gateway.max_in_flight`` requests at this gateway, or more than
``gateway.max_concurrent_per_key`` for one key, are refused at once (503 / 429 with
``Retry-After``); once tokenized, a client's request reserves its tokens of the key's
token quota (:mod:`firstlight.api.token_quota`), settled when its response ends.

The region decision: a forwarded request (hop header) is served here unless the region
is overloaded; with no healthy local replica the request **fails over** to the usable
peer with the lowest predicted TTFT; when the predicted queueing wait here exceeds
``router.admission_wait_ms`` it **overflows** to a peer that predicts better, or is
refused with 503 at once; otherwise it **spills over** when a peer's prediction (round
trip included) beats the local one by ``router.spill_over_margin_ms``. A replica that
fails before the first token is retried on another (``gateway.max_attempts``), then the
peers are tried. A stream that fails mid-way is continued on another replica, or in a
peer region when this one cannot (:mod:`firstlight.api.resume`); a forwarded stream whose
peer breaks off is continued here. A peer that fails is skipped (its breaker counts it)
and the next one is tried; when nothing can take the request the answer is 503 with
``Retry-After``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from firstlight.api.auth import SALT_KEY_PURPOSE, ApiKeys, Caller
from firstlight.api.context import ContextLoader, Ranker
from firstlight.api.dispatch import Dispatcher
from firstlight.api.forward import HOP_HEADER, PeerForwarder, api_path
from firstlight.api.in_region import RETRY_AFTER_S as _RETRY_AFTER_S
from firstlight.api.in_region import LocalBackend, LocalServer
from firstlight.api.limits import KeyLimits, Lease
from firstlight.api.plumbing import ClosingStream, closed_after, once, read_body
from firstlight.api.prepare import RequestPreparer
from firstlight.api.prompts import PromptEncoder
from firstlight.api.ranker import EmbeddingRanker
from firstlight.api.responses import Kind, error_response
from firstlight.api.resume import adopt_stream_id, resumed, take_resume
from firstlight.api.token_quota import Reservation, TokenQuota, tokens_used
from firstlight.config import PlatformConfig
from firstlight.config.sections import DEFAULT_EMBEDDING_PACKAGE, packaged_model_dir
from firstlight.dashboard import dashboard_state
from firstlight.errors import ApiError, ModelNotServedError, NoCapacityError
from firstlight.prefix import HashScheme
from firstlight.regions.hop import CallerClaim, PeerHop
from firstlight.regions.peers import PeerTable
from firstlight.regions.summary import HotPrefixes, ModelSummary, RegionSummary
from firstlight.telemetry import GatewayTelemetry, RequestObservation
from firstlight.telemetry.gateways import ExpositionShare
from firstlight.telemetry.logs import bind_request

__all__ = [  # HOP_HEADER: from .forward
    "HOP_HEADER",
    "OPERATOR_ROUTE_HEADERS",
    "GatewayCore",
    "LocalBackend",
]

_log = logging.getLogger(__name__)

OPERATOR_ROUTE_HEADERS = ("x-firstlight-replica", "x-firstlight-decision")
"""Response headers that name the region's replicas and their cost terms: sent to a
request with an operator key (or with auth off) and to a peer's verified forward (the
forwarding gateway logs them), dropped for every other client. The route, region and
predicted TTFT headers go to everyone."""


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
        limits: KeyLimits | None = None,
        ranker: Ranker | None = None,
        tokens: TokenQuota | None = None,
    ) -> None:
        self.config = config
        self.telemetry = telemetry
        self.region = region
        self.backend = backend
        self.encoders = encoders
        self.peers = peers
        self.keys = ApiKeys(config.auth, salt_key=peers.signer.derived_key(SALT_KEY_PURPOSE))
        self._client = client
        self._models = {m.name: m for m in config.models}
        self._schemes = {m.name: HashScheme.for_model(m, config.hints) for m in config.models}
        self._hot = {m.name: HotPrefixes() for m in config.models}
        self._forwarder = PeerForwarder(
            region, peers, client, telemetry, config.router.peer_timeout_s, schemes=self._schemes
        )
        self._local = LocalServer(config, region, backend, telemetry, self._schemes, self._hot)
        self._preparer = RequestPreparer(config, encoders, self._schemes)
        self._dispatcher = Dispatcher(
            config, region, backend, self._forwarder, self._local, telemetry
        )
        if ranker is None and (
            any(m.dynamic_context is not None for m in config.models)
            or any(k.dynamic_context is not None for k in config.auth.api_keys)
        ):
            embedding_ranker = EmbeddingRanker(packaged_model_dir(DEFAULT_EMBEDDING_PACKAGE))
            embedding_ranker.warm()
            ranker = embedding_ranker
        self._context = ContextLoader(config.models, encoders, ranker)
        self._created = int(time.time())
        gateway = config.gateway
        self._limits = limits or KeyLimits(
            gateway.max_concurrent_per_key, gateway.max_requests_per_minute_per_key
        )
        self._tokens = tokens or TokenQuota.from_config(gateway)
        self._total_inflight = 0
        self.exposition_share: ExpositionShare | None = None
        """Set by the Ray gateway deployment: ``/metrics`` then shows every gateway of
        the region (:mod:`firstlight.telemetry.gateways`); ``None``: this one alone."""

    # --- entry points (called by the FastAPI routes) ------------------------------------

    async def completions(self, kind: Kind, request: Request) -> Response:
        """``POST /v1/chat/completions`` (``kind="chat"``) and ``/v1/completions``.

        A request that claims to be a peer's forward (:data:`HOP_HEADER`) has its body
        read first and its signature checked (:mod:`firstlight.regions.hop`); only a
        valid one gets peer treatment (no client key, the vouched caller, the hop
        honoured, the trace continued, a continuation and the forwarder's request id
        adopted). Any other request is a client's, whatever its headers say — except
        that one carrying the hop header is never forwarded (a region whose peer key
        differs cannot start a forwarding loop)."""
        hop: PeerHop | None = None
        early: bytes | None = None
        if HOP_HEADER in request.headers:
            try:
                early = await read_body(request, self.config.gateway.max_body_bytes)
            except ApiError as exc:
                return self._refused(self.telemetry.start(kind), exc)
            hop = self.peers.signer.verify(api_path(request), request.headers, early)
        obs = self.telemetry.start(kind, request.headers, from_peer=hop is not None)
        try:
            caller = (
                self.keys.check(request.headers.get("authorization"))
                if hop is None
                else _vouched(hop)
            )
        except ApiError as exc:
            return self._refused(obs, exc)
        if self._total_inflight >= self.config.gateway.max_in_flight:
            return self._refused(
                obs,
                NoCapacityError(
                    f"this gateway is at its limit of {self.config.gateway.max_in_flight} "
                    "requests in flight (gateway.max_in_flight)",
                    code="overloaded",
                    retry_after_s=_RETRY_AFTER_S,
                ),
            )
        self._total_inflight += 1  # before the limiter's await: concurrent arrivals see it
        try:
            lease = await self._limits.acquire(caller.identity)
        except BaseException as exc:
            self._total_inflight -= 1
            if isinstance(exc, ApiError):
                return self._refused(obs, exc)
            raise
        response: Response | None = None
        reservation: Reservation | None = None
        try:
            if early is not None:
                body = early
            else:
                body = await read_body(request, self.config.gateway.max_body_bytes)
            body, resume_ids = take_resume(body, from_peer=hop is not None)
            context = None
            if kind == "chat":
                body, context = await self._context.apply(body, caller.dynamic_context)
            prepared = await self._preparer.prepare_off_loop(kind, body, caller.cache_salt)
            prepared = replace(
                prepared, caller=CallerClaim(caller.identity, caller.cache_salt, caller.tenant)
            )
            if hop is not None and hop.request_id is not None:
                prepared = adopt_stream_id(prepared, hop.request_id)  # one id across regions
            if resume_ids is not None:  # a peer continues a stream here
                name = prepared.model.name
                vocabulary = self.encoders[name].vocabulary
                prepared = resumed(
                    prepared,
                    resume_ids,
                    self._schemes[name],
                    vocabulary,
                    self.config.gateway.max_prompt_tokens,
                )
            request_id = prepared.generation.response_id
            obs.admitted(
                group=caller.group,
                model=prepared.model.name,
                request_id=request_id,
                input_tokens=prepared.routing.prompt_tokens,
            )
            bind_request(request_id, obs.span)  # its ids on every log record from here
            if hop is None:  # a peer's forward was reserved in its own region
                tokens = (prepared.routing.prompt_tokens, prepared.generation.sampling.max_tokens)
                reservation = await self._tokens.reserve(caller.identity, *tokens)
            forwardable = HOP_HEADER not in request.headers
            response = await self._dispatcher.dispatch(
                prepared, body, request, hop is not None, obs, forwardable=forwardable
            )
            if context is not None:
                response.headers["x-firstlight-context"] = context.header()
            if hop is None and not self.keys.is_operator(request.headers.get("authorization")):
                for header in OPERATOR_ROUTE_HEADERS:  # the region's topology
                    if header in response.headers:
                        del response.headers[header]
        except ApiError as exc:
            response = error_response(exc)
        except asyncio.CancelledError:
            obs.ended(CLIENT_CLOSED)  # the client went away: not a server error
            raise
        except Exception:  # a bug, not the client's fault: still OpenAI's error shape
            _log.exception("%s: unexpected error while handling a request", self.region)
            response = error_response(ApiError("internal error; it has been logged"))
        finally:
            if response is None or not isinstance(response, StreamingResponse):
                if response is not None:
                    obs.ended(response.status_code)
                elif obs.status == 200:
                    obs.ended(500)
                self._release(lease, reservation, obs)
                self.telemetry.finish(obs)
        if isinstance(response, StreamingResponse):

            def release() -> None:
                self._release(lease, reservation, obs)
                self.telemetry.finish(obs)

            done = once(release)
            response = ClosingStream(response, closed_after(response.body_iterator, done), done)
        return response

    def _refused(self, obs: RequestObservation, exc: ApiError) -> Response:
        obs.ended(exc.status)
        self.telemetry.finish(obs)
        return error_response(exc)

    def _release(
        self, lease: Lease, reservation: Reservation | None, obs: RequestObservation
    ) -> None:
        self._total_inflight -= 1
        self._limits.release(lease)
        self._tokens.settle(reservation, tokens_used(obs, self.region))

    def models(self, request: Request) -> Response:
        """``GET /v1/models``: every served model, then each LoRA adapter (its ``parent``
        the model it runs on, as vLLM's server lists them)."""
        try:
            self.keys.check(request.headers.get("authorization"))
        except ApiError as exc:
            return error_response(exc)
        return JSONResponse({"object": "list", "data": list(self._model_cards().values())})

    def model(self, request: Request, model_id: str) -> Response:
        """``GET /v1/models/{id}``: one served model or adapter, or a 404 naming them."""
        try:
            self.keys.check(request.headers.get("authorization"))
        except ApiError as exc:
            return error_response(exc)
        cards = self._model_cards()
        if model_id in cards:
            return JSONResponse(cards[model_id])
        return error_response(
            ModelNotServedError(
                f"the model {model_id!r} does not exist here; served models: {', '.join(cards)}",
                param="model",
                code="model_not_found",
            )
        )

    def _model_cards(self) -> dict[str, dict[str, object]]:
        cards: dict[str, dict[str, object]] = {}
        for model in self.config.models:
            card: dict[str, object] = {
                "id": model.name,
                "object": "model",
                "created": self._created,
                "owned_by": "firstlight",
                "max_model_len": model.max_model_len,
                "simulated": model.engine == "sim",
            }
            cards[model.name] = card
            for adapter in model.lora_adapters:
                cards[adapter.name] = {
                    **card,
                    "id": adapter.name,
                    "root": adapter.path,
                    "parent": model.name,
                }
        return cards

    async def metrics_exposition(self) -> bytes:
        """``GET /metrics``: the region's gateways (each sample labelled ``gateway``)
        when they share through Redis, else this gateway's own exposition."""
        if self.exposition_share is not None:
            return await self.exposition_share.collect()
        return self.telemetry.render()[0]

    def advice(self, caller: Caller) -> dict[str, Any]:
        """``GET /v1/firstlight/advisor``: the prefix-cache advisor's rows of this gateway
        (:mod:`firstlight.advisor`). With API keys on, a caller sees its own group only;
        the operator's dashboard shows every group."""
        rows = self.telemetry.advisor.report()
        if self.keys.enabled:
            rows = tuple(row for row in rows if row.group == caller.group)
        return {"object": "list", "region": self.region, "data": [row.to_json() for row in rows]}

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

    async def dashboard_state(self) -> dict[str, Any]:
        """The built-in dashboard's data (``GET /dashboard/api/state``): this gateway's
        view, with the rolling windows of every live gateway of the region when they
        share through Redis."""
        share = self.exposition_share
        windows = None if share is None else await share.windows()
        states = {name: self.backend.state(name) for name in self._models}
        return dashboard_state(
            self.config, self.region, states, self.peers, self.summary(), self.telemetry, windows
        )


CLIENT_CLOSED = 499
"""Status recorded when the client disconnects before the response (nginx's convention)."""


def _vouched(hop: PeerHop) -> Caller:
    """The caller a peer's signed hop vouches for: its identity for per-key limits and its
    tenant's cache salt, as the sending region authenticated them (no dynamic context:
    the sending region applied it to the body it forwarded)."""
    claim = hop.caller
    if claim is None:
        return Caller(f"peer:{hop.region}")
    return Caller(claim.identity, claim.cache_salt, claim.tenant)
