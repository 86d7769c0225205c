"""Signed hops (:mod:`firstlight.regions.hop`): what verifies and what does not."""

from __future__ import annotations

import pytest

from firstlight.regions.hop import (
    CALLER_HEADER,
    HOP_HEADER,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    CallerClaim,
    HopSigner,
    PeerHop,
)
from tests.conftest import FakeClock

KEY = "a-shared-peer-key-of-the-regions"
PATH = "/v1/chat/completions"
BODY = b'{"model": "m"}'


def _flip_last(signature: str) -> str:
    """``signature`` with its last hex digit changed (always changed, never kept)."""
    return signature[:-1] + ("1" if signature[-1] == "0" else "0")


def _pair(clock: FakeClock) -> tuple[HopSigner, HopSigner]:
    return HopSigner(KEY, "us-east", clock=clock), HopSigner(KEY, "eu-west", clock=clock)


def test_a_signed_hop_verifies_once_with_what_it_vouches_for() -> None:
    clock = FakeClock(1_700_000_000.0)
    east, west = _pair(clock)
    caller = CallerClaim("0123abcd", "salt", "acme")
    headers = east.sign(PATH, BODY, request_id="chatcmpl-1", caller=caller)
    assert west.verify(PATH, headers, BODY) == PeerHop("us-east", "chatcmpl-1", caller)
    assert west.verify(PATH, headers, BODY) is None  # the same signature again: a replay


@pytest.mark.parametrize(
    "tamper",
    [
        lambda h: {**h, HOP_HEADER: "ap-south"},
        lambda h: {**h, REQUEST_ID_HEADER: "chatcmpl-2"},
        lambda h: {**h, CALLER_HEADER: "admin;-;-"},
        lambda h: {k: v for k, v in h.items() if k != CALLER_HEADER},
        lambda h: {k: v for k, v in h.items() if k != SIGNATURE_HEADER},
        lambda h: {**h, SIGNATURE_HEADER: h[SIGNATURE_HEADER].upper()},
        lambda h: {**h, SIGNATURE_HEADER: _flip_last(h[SIGNATURE_HEADER])},
        lambda h: {**h, HOP_HEADER: "bad region!"},
    ],
    ids=[
        "region",
        "request-id",
        "caller-changed",
        "caller-dropped",
        "no-signature",
        "signature-case",
        "signature-digit",
        "region-not-a-name",
    ],
)
def test_any_change_to_a_signed_hop_voids_it(tamper: object) -> None:
    clock = FakeClock(1_700_000_000.0)
    east, west = _pair(clock)
    headers = east.sign(PATH, BODY, request_id="chatcmpl-1", caller=CallerClaim("x"))
    assert callable(tamper)
    assert west.verify(PATH, tamper(headers), BODY) is None
    assert west.verify(PATH, headers, BODY) is not None  # the untouched one still does


def test_the_body_the_path_and_the_key_are_signed() -> None:
    clock = FakeClock(1_700_000_000.0)
    east, west = _pair(clock)
    assert west.verify(PATH, east.sign(PATH, BODY), BODY + b" ") is None
    assert west.verify("/v1/completions", east.sign(PATH, BODY), BODY) is None
    stranger = HopSigner("another-deployments-key", "us-east", clock=clock)
    assert west.verify(PATH, stranger.sign(PATH, BODY), BODY) is None


@pytest.mark.parametrize(
    ("skew_s", "fresh"), [(-29.0, True), (29.0, True), (-31.0, False), (31.0, False)]
)
def test_a_signature_holds_within_the_replay_window_either_way(skew_s: float, fresh: bool) -> None:
    sender_clock, receiver_clock = FakeClock(1_700_000_000.0), FakeClock(1_700_000_000.0)
    east = HopSigner(KEY, "us-east", clock=sender_clock)
    west = HopSigner(KEY, "eu-west", clock=receiver_clock, window_s=30.0)
    receiver_clock.advance(skew_s)
    assert (west.verify(PATH, east.sign(PATH, BODY), BODY) is not None) is fresh


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        HopSigner("short", "us-east")


@pytest.mark.parametrize(
    ("value", "claim"),
    [
        ("id;salt;acme", CallerClaim("id", "salt", "acme")),
        ("id;-;-", CallerClaim("id")),
        ("id;salt", None),
        ("id;salt;acme;x", None),
        ("id with space;-;-", None),
        (";-;-", None),
    ],
)
def test_caller_claims_parse_strictly(value: str, claim: CallerClaim | None) -> None:
    assert CallerClaim.parse(value) == claim
    if claim is not None:
        assert CallerClaim.parse(claim.header()) == claim
