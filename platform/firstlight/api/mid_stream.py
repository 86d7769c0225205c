"""Continuing a stream whose replica (or peer) failed after output started.

:class:`MidStreamResumer` is built by :class:`~firstlight.api.in_region.LocalServer` and
called when reading the next chunk of a request's stream fails: while attempts are left
(``gateway.max_attempts``) it continues the request on another replica of this region
(:func:`~firstlight.api.migration.continuation`: the prompt plus the tokens already sent,
under a ticket of its own), or in a peer region through the request's ``elsewhere``
(:mod:`firstlight.api.resume`) when this region has no healthy replica left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from firstlight.api.migration import Attempts, continuation
from firstlight.api.streams import ReplicaFailedError, Stream, aclose, cause, first_chunk
from firstlight.config import PlatformConfig
from firstlight.engine.protocol import GenerationChunk
from firstlight.errors import NoCapacityError
from firstlight.prefix import HashScheme
from firstlight.region.ticket import Ticket
from firstlight.telemetry import GatewayTelemetry

if TYPE_CHECKING:
    from firstlight.api.in_region import LocalBackend, Prepared

__all__ = ["Elsewhere", "MidStreamResumer", "finish"]

_log = logging.getLogger(__name__)

Elsewhere = Callable[[tuple[int, ...]], Awaitable[tuple[Stream, GenerationChunk] | None]]
"""Continues a request in a peer region after the given output tokens: the peer's
stream and its first chunk, or ``None`` when no peer could (bound per request by the
gateway to :meth:`~firstlight.api.forward.PeerForwarder.continue_stream`)."""


def finish(ticket: Ticket | None) -> None:
    """The request's leg in this region ended, any outcome: release its ticket."""
    if ticket is not None:
        ticket.finished()


class MidStreamResumer:
    """Mid-stream resumption for one gateway's local server (see the module docstring)."""

    def __init__(
        self,
        config: PlatformConfig,
        region: str,
        backend: LocalBackend,
        telemetry: GatewayTelemetry,
        schemes: Mapping[str, HashScheme],
    ) -> None:
        self.config = config
        self.region = region
        self.backend = backend
        self.telemetry = telemetry
        self._schemes = schemes

    async def resume(
        self,
        prepared: Prepared,
        generated: list[int],
        failed: Stream,
        exc: Exception,
        attempts: Attempts,
        elsewhere: Elsewhere | None,
        ticket: Ticket | None,
    ) -> tuple[Stream, GenerationChunk, Ticket | None]:
        """Continue a request whose replica (or peer) failed after ``generated`` tokens
        (:mod:`firstlight.api.migration`): on another replica here while the region has a
        healthy one and attempts are left, else in a peer region through ``elsewhere``
        (:mod:`firstlight.api.resume`); return the new stream and its first chunk. With no
        healthy replica and no peer that answers, a last local attempt waits for a
        replacement. Raises ``exc`` when migration is off, :class:`NoCapacityError` when
        the attempts are used up."""
        name = prepared.model.name
        finish(ticket)
        await aclose(failed)
        if not self.config.gateway.stream_migration or not getattr(exc, "resumable", True):
            raise exc  # (a peer's stream without token ids cannot be continued exactly)
        reason = f"{type(cause(exc)).__name__}: {cause(exc)}"
        tried_peers = False
        while attempts.another(reason):
            if elsewhere is not None and not tried_peers and not self._healthy(name):
                tried_peers = True
                moved = await self._elsewhere(prepared, generated, elsewhere, attempts, reason)
                if moved is not None:
                    return (*moved, None)
            resumed = await self._resume_here(prepared, generated, attempts, reason)
            if isinstance(resumed, str):
                reason = resumed
                continue
            return resumed
        if elsewhere is not None and not tried_peers:  # the local attempts ran out
            moved = await self._elsewhere(prepared, generated, elsewhere, attempts, reason)
            if moved is not None:
                return (*moved, None)
        self.telemetry.migrated(name, "gave_up")
        raise NoCapacityError(
            f"the request failed mid-stream and could not be resumed: {attempts.summary()}"
        ) from exc

    def _healthy(self, model: str) -> bool:
        state = self.backend.state(model)
        return state is not None and state.healthy_replicas > 0

    async def _elsewhere(
        self,
        prepared: Prepared,
        generated: list[int],
        elsewhere: Elsewhere,
        attempts: Attempts,
        reason: str,
    ) -> tuple[Stream, GenerationChunk] | None:
        """The request continued in a peer region, or ``None`` when none could."""
        rid = prepared.generation.response_id
        moved = await elsewhere(tuple(generated))
        if moved is None:
            return None
        self.telemetry.migrated(prepared.model.name, "resumed_in_peer")
        _log.warning(
            "%s: %s resumed in a peer region after %d tokens (attempt %d): %s",
            self.region,
            rid,
            len(generated),
            attempts.used,
            reason,
        )
        return moved

    async def _resume_here(
        self, prepared: Prepared, generated: list[int], attempts: Attempts, reason: str
    ) -> tuple[Stream, GenerationChunk, Ticket | None] | str:
        """One attempt to continue the request on a replica of this region: the new
        stream, its first chunk and the continuation's ticket (its own decision,
        committed here), or why it failed."""
        name, rid = prepared.model.name, prepared.generation.response_id
        self.telemetry.migrated(name, "resumed")
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
        ticket = state.admit(routing) if state is not None else None
        if ticket is not None:
            ticket.commit(routing.prompt_tokens)
        chunks = self.backend.stream(name, request, routing, {})
        try:
            async with asyncio.timeout(self.config.gateway.first_token_timeout_s):
                _, first = await first_chunk(chunks)
        except (ReplicaFailedError, TimeoutError) as again:
            finish(ticket)
            await aclose(chunks)
            return str(again) or type(again).__name__
        except BaseException:
            finish(ticket)
            await aclose(chunks)
            raise
        if isinstance(first, GenerationChunk):  # always: a continuation is ours
            return chunks, first, ticket
        finish(ticket)
        await aclose(chunks)
        return "the replica answered a continuation with rendered output"
