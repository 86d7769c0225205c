"""Routes shared between the gateways of one region: each router's bookkeeping sees every
gateway's requests, not only its own.

A region runs several gateways (``gateway.replicas``) and each holds its own request
router for each model. What a router counts by itself — the prefill it reserved on a
replica since that replica's last stats, the KV blocks of the requests it has in flight
there, where it last sent each prefix — then covers only the share of the region's
traffic that came through its gateway, and two gateways each see half of every hot
replica's queue. Stats from the replicas see everyone's work, but up to a stats period
late; that is the gap the counts exist to fill.

So every router announces its routes' lifecycle (:class:`RouteEvent`: routed, first token,
done) and applies the other routers' announcements to its policy through the same hooks
its own routes use (:meth:`~firstlight.region.state.RouterState.apply_peer_route`). A
route carries the cost terms its router predicted, so a peer's first token also
calibrates every router's correction for that replica (the sample, observed over
uncorrected service time, does not depend on who predicted).

This module is the pure part: the record and its wire form (:func:`encode_routes`,
:func:`decode_routes`). The Redis pub/sub adapter is
:class:`firstlight.serve.route_share.RouteShare`; the benchmark's simulator delivers the
same events after a configured delay (:mod:`firstlight_bench.simulator.sim_region`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from firstlight.routing import TtftTerms

__all__ = [
    "MalformedRoutesError",
    "RouteBatch",
    "RouteEvent",
    "RouteShareStatus",
    "decode_routes",
    "encode_routes",
]

RouteStage = Literal["routed", "first_token", "done"]
_STAGES: tuple[RouteStage, ...] = ("routed", "first_token", "done")
_MAX_HASH = 2**64 - 1


class MalformedRoutesError(ValueError):
    """A shared-routes message that is not what :func:`encode_routes` writes."""


@dataclass(frozen=True, slots=True)
class RouteEvent:
    """One step of one request's life on a replica, as a router announces it.

    ``routed`` carries what the policies' bookkeeping needs (the prompt's length and
    block hashes, the replica, how many of its blocks were cached there, the cost terms
    predicted for it, if any); the later stages name the request only (and
    ``first_token`` the observed TTFT).
    """

    stage: RouteStage
    request_id: str
    replica_id: str = ""
    prompt_tokens: int = 0
    block_size: int = 32
    block_hashes: tuple[int, ...] = ()
    cached_blocks: int = 0
    observed_ttft_ms: float = 0.0
    terms: TtftTerms | None = None


@dataclass(frozen=True, slots=True)
class RouteBatch:
    """One message: a router's events, in the order they happened."""

    router: str
    """The sending router's id (random per router instance)."""
    session: int
    """The sender's connection count: a new one means messages it sent in between may
    be lost, so receivers forget what they heard from it before."""
    events: tuple[RouteEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class RouteShareStatus:
    """What one router's route share is doing (metrics: ``firstlight.route.share_up``,
    ``firstlight.route.shared_events``)."""

    connected: bool
    sent: int
    """Events this router published."""
    heard: int
    """Events of other routers it applied."""
    dropped: int
    """Events it could not send (Redis unreachable, or its buffer full)."""


def encode_routes(batch: RouteBatch) -> bytes:
    """``batch`` as one message (compact JSON)."""
    rows = [
        [
            _STAGES.index(e.stage),
            e.request_id,
            e.replica_id,
            e.prompt_tokens,
            e.block_size,
            list(e.block_hashes),
            e.cached_blocks,
            e.observed_ttft_ms,
            _terms_row(e.terms),
        ]
        for e in batch.events
    ]
    body = {"router": batch.router, "session": batch.session, "events": rows}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_routes(message: bytes | str) -> RouteBatch:
    """The batch in ``message``; raises :class:`MalformedRoutesError` for anything
    :func:`encode_routes` would not have written."""
    try:
        body = json.loads(message)
        router, session, rows = body["router"], body["session"], body["events"]
        if not isinstance(router, str) or not isinstance(rows, list):
            raise TypeError("router or events of the wrong type")
        if type(session) is not int or session < 0:
            raise ValueError(f"session {session!r} is not a non-negative integer")
        return RouteBatch(router, session, tuple(_event(row) for row in rows))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise MalformedRoutesError(f"not a shared-routes message: {exc}") from exc


def _terms_row(terms: TtftTerms | None) -> list[float] | None:
    if terms is None:
        return None
    return [
        terms.rtt_ms,
        terms.wait_ms,
        terms.prefill_ms,
        terms.overhead_ms,
        terms.cached_tokens,
        terms.uncached_tokens,
        terms.correction,
        terms.host_tokens,
        terms.reload_ms,
    ]


def _terms(row: object) -> TtftTerms | None:
    """Terms from a row of 9 numbers, or of 7 from a gateway that predates host-tier
    terms (a rolling upgrade: no host-tier tokens)."""
    if row is None:
        return None
    if not isinstance(row, list) or len(row) not in (7, 9):
        raise TypeError(f"terms {row!r} are not a list of 9 (or 7) numbers")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in row):
        raise TypeError(f"terms {row!r} are not numbers")
    rtt, wait, prefill, overhead, cached, uncached, correction, *host = row
    host_tokens, reload_ms = host or (0, 0.0)
    if (
        type(cached) is not int
        or type(uncached) is not int
        or type(host_tokens) is not int
        or host_tokens < 0
        or reload_ms < 0
        or not correction > 0
    ):
        raise ValueError(f"terms {row!r} have bad token counts, reload or correction")
    return TtftTerms(
        float(rtt),
        float(wait),
        float(prefill),
        float(overhead),
        cached,
        uncached,
        float(correction),
        host_tokens=host_tokens,
        reload_ms=float(reload_ms),
    )


def _event(row: object) -> RouteEvent:
    if not isinstance(row, list) or len(row) != 9:
        raise TypeError(f"event row {row!r} is not a list of 9 fields")
    stage, request_id, replica_id, prompt, block_size, hashes, cached, observed, terms = row
    ints = (stage, prompt, block_size, cached)
    if not all(type(v) is int and v >= 0 for v in ints) or stage >= len(_STAGES):
        raise ValueError(f"event row {row!r} has a bad stage or count")
    if not isinstance(request_id, str) or not isinstance(replica_id, str) or not request_id:
        raise TypeError(f"event row {row!r} has a bad request or replica id")
    if not isinstance(hashes, list) or not all(
        type(h) is int and 0 <= h <= _MAX_HASH for h in hashes
    ):
        raise ValueError(f"event row {row!r} has bad block hashes")
    if not isinstance(observed, int | float) or block_size < 1:
        raise ValueError(f"event row {row!r} has a bad block size or TTFT")
    return RouteEvent(
        _STAGES[stage],
        request_id,
        replica_id,
        prompt,
        block_size,
        tuple(hashes),
        cached,
        float(observed),
        _terms(terms),
    )
