"""Forwarding a request to a peer region's gateway (spill-over and fail-over).

:class:`PeerForwarder` is built by :class:`~firstlight.api.gateway.GatewayCore` with the
region's :class:`~firstlight.regions.PeerTable` and HTTP client. The core asks it to
:meth:`~PeerForwarder.rank` the usable peers for a request (no I/O) and, once it decided
to leave the region, to :meth:`~PeerForwarder.forward_any`: the request goes to the best
peer whose breaker allows it, streamed back as it arrives, with :data:`HOP_HEADER` so the
peer never forwards it again and the route span's ``traceparent`` so the trace continues
there. A peer that fails before answering is recorded (its breaker counts it) and the next
one is tried; in local mode the configured RTT is waited out first (emulation).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from opentelemetry import trace

from firstlight.api.responses import DONE_EVENT, error_body, sse_event
from firstlight.errors import NoCapacityError
from firstlight.regions.peers import Peer, PeerTable
from firstlight.regions.summary import predict_peer_ttft
from firstlight.routing import Decision, RequestView
from firstlight.telemetry import GatewayTelemetry, RequestObservation
from firstlight.telemetry.tracing import inject

__all__ = ["HOP_HEADER", "PeerForwarder"]

HOP_HEADER = "x-firstlight-hop"
"""Set on forwarded requests; a request carrying it is never forwarded again."""
_FORWARDED_HEADERS = ("content-type", "retry-after")


class PeerForwarder:
    """Spill-over and fail-over to peer regions (see the module docstring)."""

    def __init__(
        self,
        region: str,
        peers: PeerTable,
        client: httpx.AsyncClient,
        telemetry: GatewayTelemetry,
    ) -> None:
        self.region = region
        self.peers = peers
        self.telemetry = telemetry
        self._client = client

    def rank(
        self, model: str, routing: RequestView, local_ms_per_token: float | None
    ) -> list[tuple[Peer, float]]:
        """Usable peers for ``model`` with their predicted TTFT (round trip included),
        best first (no I/O)."""
        ranked = []
        for peer in self.peers.usable(model):
            assert peer.summary is not None
            summary = peer.summary.models[model]
            predicted = predict_peer_ttft(
                summary, routing, peer.rtt_ms, local_ms_per_token, peer.forwarded_tokens
            )
            ranked.append((peer, predicted))
        ranked.sort(key=lambda item: item[1])
        return ranked

    async def forward_any(
        self,
        ranked: list[tuple[Peer, float]],
        body: bytes,
        request: Request,
        route: str,
        obs: RequestObservation,
        stream: bool,
        prompt_tokens: int,
        local: Decision | None = None,
    ) -> Response | None:
        """Forward to the first peer of ``ranked`` that answers; ``None`` if none did.
        The answering peer is charged ``prompt_tokens`` of backlog until its next summary."""
        for peer, predicted_ms in ranked:
            if not peer.breaker.allow():
                continue
            span = self.telemetry.begin_route(obs, route.replace("-", "_"))
            obs.served_region, obs.predicted_ttft_ms = peer.region, predicted_ms
            versus = "no healthy local replica" if local is None else f"local {local.explain()}"
            obs.explanation = (
                f"{route} to {peer.region}: predicted {predicted_ms:.1f} ms "
                f"(rtt {peer.rtt_ms:.1f} ms) vs {versus}"
            )
            span.set_attribute("firstlight.peer", peer.region)
            span.set_attribute("firstlight.predicted_ttft_ms", predicted_ms)
            span.set_attribute("firstlight.terms.rtt_ms", peer.rtt_ms)
            response = await self._forward(peer, predicted_ms, body, request, route, obs, stream)
            if response is not None:
                peer.forwarded_tokens += prompt_tokens
                return response
        return None

    async def _forward(
        self,
        peer: Peer,
        predicted_ms: float,
        body: bytes,
        request: Request,
        route: str,
        obs: RequestObservation,
        stream: bool,
    ) -> Response | None:
        """Stream the request through ``peer``; ``None`` when the peer failed before
        answering (the caller tries the next one)."""
        headers = {
            "content-type": "application/json",
            HOP_HEADER: self.region,
        }
        if obs.route_span is not None:
            headers.update(inject(obs.route_span))
        auth = request.headers.get("authorization")
        if auth is not None:
            headers["authorization"] = auth
        path = request.url.path.removeprefix(request.scope.get("root_path", ""))
        if peer.emulated_ms:
            await asyncio.sleep(peer.emulated_ms / 1000.0)
        try:
            outgoing = self._client.build_request(
                "POST", f"{peer.url}{path}", content=body, headers=headers
            )
            upstream = await self._client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            self._failed(peer, obs, f"{type(exc).__name__}: {exc}")
            return None
        if upstream.status_code >= 500:
            await upstream.aclose()
            self._failed(peer, obs, f"HTTP {upstream.status_code}")
            return None
        self.peers.record_success(peer)
        obs.status = upstream.status_code
        if stream and upstream.status_code < 400:
            # A streaming peer answers once its first token exists; a non-streaming one
            # only at the end, so its TTFT is the peer's to record, not ours.
            obs.first_token()
        obs.replica = upstream.headers.get("x-firstlight-replica")
        out_headers = {k: v for k, v in upstream.headers.items() if k in _FORWARDED_HEADERS}
        out_headers.update(
            {k: v for k, v in upstream.headers.items() if k.startswith("x-firstlight-")}
        )
        out_headers["x-firstlight-route"] = route
        out_headers["x-firstlight-predicted-ttft-ms"] = f"{predicted_ms:.1f}"
        if obs.explanation is not None:
            out_headers["x-firstlight-decision"] = obs.explanation.encode(
                "ascii", "replace"
            ).decode()

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for piece in upstream.aiter_raw():
                    yield piece
            except httpx.HTTPError as exc:
                self.peers.record_failure(peer, f"{type(exc).__name__}: {exc}")
                obs.status = NoCapacityError.status
                yield sse_event(error_body(NoCapacityError(f"peer {peer.region} failed")))
                yield DONE_EVENT
            finally:
                await upstream.aclose()

        return StreamingResponse(relay(), status_code=upstream.status_code, headers=out_headers)

    def _failed(self, peer: Peer, obs: RequestObservation, error: str) -> None:
        """The attempt on ``peer`` failed before it answered: its breaker counts it and
        the attempt's route span says why."""
        self.peers.record_failure(peer, error)
        span = obs.route_span
        if span is not None:
            span.set_status(trace.StatusCode.ERROR, error)
