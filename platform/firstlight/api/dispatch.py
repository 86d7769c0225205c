"""Carrying out the region decision for one prepared request.

:class:`Dispatcher` is built once per gateway by :class:`~firstlight.api.gateway.GatewayCore`
and called once per request (:meth:`Dispatcher.dispatch`), after the request is
authenticated, admitted and prepared. It admits the request at the model's router state
(its ticket: the one estimate of where it would be served here), takes the region
decision (:func:`firstlight.region.decide_region`) and carries it out: the peers in the
decision's order through :class:`~firstlight.api.forward.PeerForwarder`, the region's
replicas through :class:`~firstlight.api.in_region.LocalServer`, a local attempt that
failed before any output retried on another replica (``gateway.max_attempts``), then
failed over to the peers; a 503 with ``Retry-After`` when nothing can take it.
"""

from __future__ import annotations

import functools
import logging

from fastapi import Request
from fastapi.responses import Response
from opentelemetry import trace

from firstlight.api.forward import PeerForwarder
from firstlight.api.in_region import RETRY_AFTER_S as _RETRY_AFTER_S
from firstlight.api.in_region import LocalBackend, LocalServer, Prepared
from firstlight.api.mid_stream import Elsewhere
from firstlight.api.migration import Attempts
from firstlight.api.streams import ReplicaFailedError, Stream
from firstlight.config import PlatformConfig
from firstlight.engine.protocol import GenerationChunk
from firstlight.errors import NoCapacityError
from firstlight.region import RouterState
from firstlight.region.decision import PeerChoice, RegionDecision, decide_region, rank_peers
from firstlight.routing import Decision
from firstlight.telemetry import GatewayTelemetry, RequestObservation

__all__ = ["Dispatcher"]

_log = logging.getLogger(__name__)


class Dispatcher:
    """Where one region's requests go, and going there (see the module docstring)."""

    def __init__(
        self,
        config: PlatformConfig,
        region: str,
        backend: LocalBackend,
        forwarder: PeerForwarder,
        local: LocalServer,
        telemetry: GatewayTelemetry,
    ) -> None:
        self.config = config
        self.region = region
        self.backend = backend
        self.telemetry = telemetry
        self._forwarder = forwarder
        self._local = local

    async def dispatch(
        self,
        prepared: Prepared,
        body: bytes,
        request: Request,
        hop: bool,
        obs: RequestObservation,
        *,
        forwardable: bool = True,
    ) -> Response:
        """Decide where the request goes (:func:`~firstlight.region.decide_region`) and
        carry it out: forward to the decision's peers in order, then fall back; retry a
        local attempt that failed before any output, then fail over. ``hop``: a peer's
        verified forward; not ``forwardable``: no peer is considered at all."""
        state = self.backend.state(prepared.model.name)
        ticket = state.admit(prepared.routing) if state is not None else None
        local = ticket.estimate if ticket is not None else None
        # No router state yet means Ray has not told us of any replica.
        healthy = state is not None and state.healthy_replicas > 0
        ranked = self._ranked(prepared, local) if forwardable and not hop else ()
        decision = decide_region(
            local, healthy=healthy, from_peer=hop, peers=ranked, router=self.config.router
        )
        if decision.route == "refuse":
            raise self._refusal(prepared, decision, forwarded=False)
        from_peer = decision.route == "from_peer"
        # Where a stream goes on if its replica or peer fails mid-stream and this region
        # cannot continue it (firstlight.api.resume); for a forwarded request, the
        # forwarding gateway decides (one hop).
        elsewhere = (
            None
            if from_peer or not forwardable
            else functools.partial(self._forwarder.continue_stream, prepared, body, request, obs)
        )
        if decision.route not in ("local", "from_peer"):
            if elsewhere is not None:
                route = "spill_over" if decision.route == "overflow" else decision.route
                forwarded = await self._forward(
                    decision, route, prepared, body, request, obs, elsewhere
                )
                if forwarded is not None:
                    return forwarded
            # Nothing forwarded (no peer answered, or the request may not be forwarded).
            if decision.fallback == "refuse":
                raise self._refusal(prepared, decision, forwarded=elsewhere is not None)
        attempts = Attempts(self.config.gateway.max_attempts)
        reason = "from_peer" if from_peer else "local"
        while True:
            try:
                return await self._local.serve(
                    prepared, "local", ticket, obs, reason, elsewhere, token_ids=from_peer
                )
            except ReplicaFailedError as exc:
                _log.warning("%s: local attempt failed before any output: %s", self.region, exc)
                if obs.route_span is not None:
                    obs.route_span.set_status(trace.StatusCode.ERROR, str(exc))
                if state is None or state.healthy_replicas == 0 or not attempts.another(str(exc)):
                    self.telemetry.migrated(prepared.model.name, "gave_up")
                    if elsewhere is None:  # a forwarded request: the forwarder tries on
                        raise self._failed_here(prepared, state) from exc
                    return await self._fail_over(prepared, body, request, obs, local, elsewhere)
                self.telemetry.migrated(prepared.model.name, "retried")
                ticket = state.admit(prepared.routing)  # another replica, knowing this
                local = ticket.estimate

    def _ranked(self, prepared: Prepared, local: Decision | None) -> tuple[PeerChoice, ...]:
        options = self._forwarder.options(prepared.model.name)
        return rank_peers(prepared.routing, options, local, self.config.router.spill_copy_weight)

    async def _forward(
        self,
        decision: RegionDecision,
        route: str,
        prepared: Prepared,
        body: bytes,
        request: Request,
        obs: RequestObservation,
        elsewhere: Elsewhere,
    ) -> Response | None:
        """Forward to the first of the decision's peers that answers; ``None`` if none
        did. ``route`` names the forward in headers and metrics. A streamed answer the
        gateway itself renders is read chunk by chunk, so that a peer that breaks off
        mid-stream is resumed here (or at ``elsewhere``) instead of ending the stream."""

        def relay(first: GenerationChunk, chunks: Stream, headers: dict[str, str]) -> Response:
            return self._local.stream_response(prepared, first, chunks, obs, headers, elsewhere)

        return await self._forwarder.forward_any(
            decision.peers,
            body,
            request,
            route,
            obs,
            prepared.kind,
            prepared.stream,
            prepared.routing.prompt_tokens,
            None if route == "fail_over" else decision.local,
            rendered=prepared.openai is not None,
            relay=relay,
            prompt_blocks=prepared.routing.prompt_blocks,
            caller=prepared.caller,
        )

    async def _fail_over(
        self,
        prepared: Prepared,
        body: bytes,
        request: Request,
        obs: RequestObservation,
        local: Decision | None,
        elsewhere: Elsewhere,
    ) -> Response:
        """Every local attempt failed: the usable peers, best first (priced with the
        last local estimate's rate), or a refusal."""
        decision = decide_region(
            None,
            healthy=False,
            from_peer=False,
            peers=self._ranked(prepared, local),
            router=self.config.router,
        )
        forwarded = await self._forward(
            decision, "fail_over", prepared, body, request, obs, elsewhere
        )
        if forwarded is not None:
            return forwarded
        raise self._failed_here(prepared, self.backend.state(prepared.model.name), decision)

    def _failed_here(
        self,
        prepared: Prepared,
        state: RouterState | None,
        decision: RegionDecision | None = None,
    ) -> NoCapacityError:
        """The 503 for a request every local attempt failed (``decision``: the fail-over
        decision, after no peer answered; ``None`` for a forwarded request)."""
        tail = "" if decision is None else " and no peer region could take it"
        if state is not None and state.healthy_replicas > 0:
            return NoCapacityError(
                f"the request failed on every replica of {prepared.model.name!r} it was "
                f"tried on in region {self.region} (gateway.max_attempts){tail}",
                retry_after_s=_RETRY_AFTER_S,
            )
        if decision is None:
            return NoCapacityError(
                f"no healthy replica of {prepared.model.name!r} in region {self.region}",
                retry_after_s=_RETRY_AFTER_S,
            )
        return self._refusal(prepared, decision, forwarded=True)

    def _refusal(
        self, prepared: Prepared, decision: RegionDecision, *, forwarded: bool
    ) -> NoCapacityError:
        """The 503 for a refused decision (``forwarded``: after no peer answered)."""
        model = prepared.model.name
        if decision.refusal == "no_replica":
            tail = " and no peer region could take the request" if forwarded else ""
            return NoCapacityError(
                f"no healthy replica of {model!r} in region {self.region}{tail}",
                retry_after_s=_RETRY_AFTER_S,
            )
        bound_ms = self.config.router.admission_wait_ms
        if not forwarded:
            return NoCapacityError(
                f"region {self.region} is overloaded (predicted wait "
                f"{decision.wait_ms:.0f} ms > router.admission_wait_ms)",
                code="overloaded",
                retry_after_s=_RETRY_AFTER_S,
            )
        return NoCapacityError(
            f"region {self.region} is overloaded: the predicted queueing wait of "
            f"{decision.wait_ms:.0f} ms exceeds router.admission_wait_ms "
            f"({bound_ms or 0:.0f} ms) and no peer region could take the request",
            code="overloaded",
            retry_after_s=min(max(decision.wait_ms / 1000.0, _RETRY_AFTER_S), 60.0),
        )
