"""Forwarding a request to a peer region's gateway (spill-over and fail-over).

:class:`PeerForwarder` is built by :class:`~firstlight.api.gateway.GatewayCore` with the
region's :class:`~firstlight.regions.PeerTable` and HTTP client. The core asks it to
:meth:`~PeerForwarder.rank` the usable peers for a request (no I/O) and, once it decided
to leave the region, to :meth:`~PeerForwarder.forward_any`: the request goes to the best
peer whose breaker allows it, streamed back as it arrives, with :data:`HOP_HEADER` so the
peer never forwards it again and the route span's ``traceparent`` so the trace continues
there. A peer that fails before answering is recorded (its breaker counts it) and the next
one is tried; in local mode the configured RTT is waited out first (emulation).

Forwards always stream from the peer, also for a client that asked for one JSON body
(the chunks are put together here), so ``router.peer_timeout_s`` bounds the wait for
the peer's first token and for each later chunk, and a peer that stops answering its
probes is abandoned while the forward still waits for it — for its first answer or, once
that started, for the next chunk (:func:`~firstlight.regions.peers.while_answering`; a
stream is then continued elsewhere, :mod:`firstlight.api.resume`). A non-streamed answer that
failed part-way has sent nothing to the client yet: it counts as a failed attempt and
the next peer (or this region) serves the request instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import trace

from firstlight.api._peer_answer import answer_or_failure, as_stream, collect_stream, read_or_none
from firstlight.api.in_region import Prepared
from firstlight.api.migration import continuation
from firstlight.api.responses import DONE_EVENT, Kind, error_body, sse_event
from firstlight.api.resume import peer_chunks, resume_body
from firstlight.api.streams import ReplicaFailedError, Stream, aclose, first_chunk
from firstlight.engine.protocol import GenerationChunk
from firstlight.errors import NoCapacityError
from firstlight.prefix import HashScheme
from firstlight.region.decision import PeerChoice, PeerOption, rank_peers
from firstlight.regions.hop import HOP_HEADER, CallerClaim
from firstlight.regions.peers import Peer, PeerTable, while_answering
from firstlight.routing import Decision
from firstlight.telemetry import GatewayTelemetry, RequestObservation
from firstlight.telemetry.tracing import inject

__all__ = ["HOP_HEADER", "PeerForwarder", "api_path"]


def api_path(request: Request) -> str:
    """The request's path below any prefix the proxy mounted the gateway at (a local
    region's route prefix): what a forward appends to a peer's URL, and what a signed
    hop signs."""
    path: str = request.url.path
    return path.removeprefix(request.scope.get("root_path", ""))


_FORWARDED_HEADERS = ("content-type", "retry-after")
_PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "text": "/v1/completions"}

Relay = Callable[[GenerationChunk, Stream, dict[str, str]], Response]
"""Writes the client's stream from a peer's first chunk, the rest of its chunks and the
response headers (the gateway binds
:meth:`~firstlight.api.in_region.LocalServer.stream_response`)."""


class PeerForwarder:
    """Spill-over and fail-over to peer regions (see the module docstring)."""

    def __init__(
        self,
        region: str,
        peers: PeerTable,
        client: httpx.AsyncClient,
        telemetry: GatewayTelemetry,
        timeout_s: float = 10.0,
        *,
        schemes: Mapping[str, HashScheme],
    ) -> None:
        self.region = region
        self._schemes = schemes
        self.peers = peers
        self.telemetry = telemetry
        self._client = client
        self._timeout = httpx.Timeout(connect=2.0, read=timeout_s, write=10.0, pool=5.0)

    def options(self, model: str) -> list[PeerOption]:
        """The usable peers for ``model``, as the region decision needs them (no I/O)."""
        options = []
        for peer in self.peers.usable(model):
            assert peer.summary is not None
            summary = peer.summary.models[model]
            options.append(
                PeerOption(
                    peer.region,
                    summary,
                    peer.rtt_ms,
                    peer.forwarded.tokens,
                    peer.forwarded.blocks,
                )
            )
        return options

    async def forward_any(
        self,
        ranked: tuple[PeerChoice, ...],
        body: bytes,
        request: Request,
        route: str,
        obs: RequestObservation,
        kind: Kind,
        stream: bool,
        prompt_tokens: int,
        local: Decision | None = None,
        rendered: bool = False,
        relay: Relay | None = None,
        prompt_blocks: int = 0,
        caller: CallerClaim | None = None,
    ) -> Response | None:
        """Forward to the first peer of ``ranked`` that answers; ``None`` if none did.
        ``caller``: who this gateway authenticated, vouched for in the signed hop.
        Each peer tried is charged ``prompt_tokens`` of backlog until its answer starts
        (or the forward fails, or its next summary arrives: ``Peer.forwarded``), and
        ``prompt_blocks`` of KV cache until its next summary.
        ``rendered``: the request is one vLLM's OpenAI layer serves (fields beyond the
        gateway's subset), so a JSON answer is relayed as the peer wrote it, not rebuilt
        from a stream. ``relay`` writes a streamed answer from the peer's chunks (so it
        can be continued elsewhere if the peer breaks off); without it the peer's bytes
        are relayed as they come."""
        for choice in ranked:
            peer = self.peers.peers.get(choice.region)
            predicted_ms = choice.predicted_ttft_ms
            if peer is None or not peer.breaker.allow():
                continue
            span = self.telemetry.begin_route(obs, route)
            versus = "no healthy local replica" if local is None else f"local {local.explain()}"
            obs.served(
                peer.region,
                predicted_ttft_ms=predicted_ms,
                explanation=(
                    f"{route} to {peer.region}: predicted {predicted_ms:.1f} ms "
                    f"(rtt {peer.rtt_ms:.1f} ms) vs {versus}"
                ),
            )
            span.set_attribute("firstlight.peer", peer.region)
            span.set_attribute("firstlight.predicted_ttft_ms", predicted_ms)
            span.set_attribute("firstlight.terms.rtt_ms", peer.rtt_ms)
            key = obs.request_id or f"forward-{id(obs)}"
            peer.forwarded.sent(key, prompt_tokens, prompt_blocks)
            try:
                response = await self._forward(
                    peer,
                    predicted_ms,
                    body,
                    request,
                    route,
                    obs,
                    kind,
                    stream,
                    rendered,
                    relay,
                    caller,
                )
            finally:
                peer.forwarded.answered(key)
            if response is not None:
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
        kind: Kind,
        stream: bool,
        rendered: bool = False,
        relay: Relay | None = None,
        caller: CallerClaim | None = None,
    ) -> Response | None:
        """Send the request to ``peer``; ``None`` when the peer failed before anything
        reached the client (the caller tries the next one)."""
        path = api_path(request)
        content = body if stream or rendered else as_stream(body)
        upstream = await self._send(peer, path, content, obs, caller)
        if upstream is None:
            return None
        obs.ended(upstream.status_code)
        if upstream.status_code < 400:
            obs.first_token()  # the peer streams: its headers come with the first token
        obs.served(
            peer.region,
            replica=upstream.headers.get("x-firstlight-replica"),
            predicted_ttft_ms=obs.predicted_ttft_ms,
            explanation=obs.explanation,
        )
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
        if not stream and upstream.status_code < 400 and not rendered:
            return await self._collected(peer, upstream, kind, obs, out_headers)
        if relay is not None and stream and upstream.status_code == 200 and not rendered:
            chunks = peer_chunks(upstream, kind, peer)
            try:
                _, first = await first_chunk(chunks)
            except ReplicaFailedError as exc:
                await aclose(chunks)
                self._failed(peer, obs, str(exc))
                return None
            assert isinstance(first, GenerationChunk)  # peer_chunks yields no other
            return relay(first, chunks, out_headers)
        if not stream:  # a refusal (4xx) or vLLM's rendered answer: its JSON, as it is
            answer = await read_or_none(upstream)
            if answer is None:
                self._failed(peer, obs, "the peer's answer broke off")
                return None
            out_headers.pop("content-type", None)
            return Response(answer, upstream.status_code, out_headers, "application/json")

        async def raw() -> AsyncIterator[bytes]:
            try:
                async for piece in while_answering(upstream.aiter_raw(), peer):
                    yield piece
            except httpx.HTTPError as exc:
                self.peers.record_failure(peer, f"{type(exc).__name__}: {exc}")
                obs.ended(NoCapacityError.status)
                yield sse_event(error_body(NoCapacityError(f"peer {peer.region} failed")))
                yield DONE_EVENT
            finally:
                await upstream.aclose()

        return StreamingResponse(raw(), status_code=upstream.status_code, headers=out_headers)

    async def continue_stream(
        self,
        prepared: Prepared,
        body: bytes,
        request: Request,
        obs: RequestObservation,
        generated: tuple[int, ...],
    ) -> tuple[Stream, GenerationChunk] | None:
        """Continue ``prepared`` (the client's ``body``) in the best usable peer region
        after the ``generated`` output tokens the client already has
        (:mod:`firstlight.api.resume`): the peer's stream and its first chunk, or
        ``None`` when no peer could. Called by the gateway's resume loop."""
        model = prepared.model.name
        _, routing = continuation(prepared.generation, generated, self._schemes[model])
        path = _PATHS[prepared.kind]
        content = resume_body(body, generated)
        for choice in rank_peers(routing, self.options(model), None):
            peer = self.peers.peers.get(choice.region)
            if peer is None or not peer.breaker.allow():
                continue
            key = obs.request_id or f"resume-{id(obs)}"
            peer.forwarded.sent(key, routing.prompt_tokens, routing.prompt_blocks)
            try:
                upstream = await self._send(peer, path, content, obs, prepared.caller)
                if upstream is None:
                    continue
                if upstream.status_code != 200:
                    await upstream.aclose()
                    self._failed(peer, obs, f"HTTP {upstream.status_code} to a continuation")
                    continue
                chunks = peer_chunks(upstream, prepared.kind, peer)
                try:
                    _, first = await first_chunk(chunks)
                except ReplicaFailedError as exc:
                    await aclose(chunks)
                    self._failed(peer, obs, str(exc))
                    continue
            finally:
                peer.forwarded.answered(key)
            obs.served(  # the continuation's replica is the peer's now
                peer.region,
                replica=upstream.headers.get("x-firstlight-replica"),
                predicted_ttft_ms=obs.predicted_ttft_ms,
                explanation=obs.explanation,
            )
            assert isinstance(first, GenerationChunk)  # peer_chunks yields no other
            return chunks, first
        return None

    async def _send(
        self,
        peer: Peer,
        path: str,
        content: bytes,
        obs: RequestObservation,
        caller: CallerClaim | None,
    ) -> httpx.Response | None:
        """POST ``content`` to ``peer``'s ``path`` as a signed hop (the request id and the
        caller it vouches for; never the client's key) with the trace context, streamed;
        the response once it started (below 500), or ``None`` when the peer failed first
        (recorded)."""
        headers = {"content-type": "application/json"}
        headers.update(
            self.peers.signer.sign(path, content, request_id=obs.request_id or None, caller=caller)
        )
        if obs.route_span is not None:
            headers.update(inject(obs.route_span))
        if peer.emulated_ms:
            await asyncio.sleep(peer.emulated_ms / 1000.0)
        outgoing = self._client.build_request(
            "POST", f"{peer.url}{path}", content=content, headers=headers, timeout=self._timeout
        )
        try:
            upstream = await answer_or_failure(self._client.send(outgoing, stream=True), peer)
        except httpx.HTTPError as exc:
            self._failed(peer, obs, f"{type(exc).__name__}: {exc}")
            return None
        if upstream is None:
            self._failed(peer, obs, peer.last_error or "stopped answering its probes")
            return None
        if upstream.status_code >= 500:
            await upstream.aclose()
            self._failed(peer, obs, f"HTTP {upstream.status_code}")
            return None
        self.peers.record_success(peer)
        return upstream

    async def _collected(
        self,
        peer: Peer,
        upstream: httpx.Response,
        kind: Kind,
        obs: RequestObservation,
        headers: dict[str, str],
    ) -> Response | None:
        """The peer's stream put together into one JSON body for a client that asked
        for one; ``None`` when the stream broke off or ended in an error (the client has
        seen nothing yet, so the caller may serve the request elsewhere)."""
        try:
            answer = await collect_stream(upstream, kind, peer)
        except httpx.HTTPError as exc:
            self._failed(peer, obs, f"{type(exc).__name__}: {exc}")
            return None
        finally:
            await upstream.aclose()
        if isinstance(answer, str):
            self._failed(peer, obs, answer)
            return None
        obs.completed()
        headers.pop("content-type", None)
        return JSONResponse(answer, headers=headers)

    def _failed(self, peer: Peer, obs: RequestObservation, error: str) -> None:
        """The attempt on ``peer`` failed before it answered: its breaker counts it and
        the attempt's route span says why."""
        self.peers.record_failure(peer, error)
        span = obs.route_span
        if span is not None:
            span.set_status(trace.StatusCode.ERROR, error)
