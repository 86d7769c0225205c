"""The dashboard's rolling windows as records other gateways read: the codec round-trips
and refuses anything else, and the merge pools samples, adds counts and rates, and keeps
the newest decisions of all gateways (pure, no Redis)."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstlight.telemetry.rolling import DecisionRecord
from firstlight.telemetry.windows import (
    GatewayWindow,
    MalformedWindowError,
    ModelWindow,
    decode_window,
    encode_window,
    merge_windows,
)

_MS = st.floats(min_value=0.0, max_value=1e6, allow_nan=False).map(lambda v: round(v, 3))
_TEXT = st.text(min_size=1, max_size=12)
_DECISION = st.builds(
    DecisionRecord,
    at=st.floats(min_value=0, max_value=2e9, allow_nan=False),
    model=_TEXT,
    route=st.sampled_from(["local", "spill_over", "fail_over", "from_peer", "rejected"]),
    region=st.none() | _TEXT,
    replica=st.none() | _TEXT,
    predicted_ttft_ms=st.none() | _MS,
    observed_ttft_ms=st.none() | _MS,
    explanation=st.none() | st.text(max_size=80),
)
_WINDOW = st.builds(
    GatewayWindow,
    gateway=_TEXT,
    observed_window_s=st.floats(min_value=1.0, max_value=300.0),
    models=st.dictionaries(
        _TEXT,
        st.builds(
            ModelWindow,
            ttft_ms=st.lists(_MS, max_size=20).map(tuple),
            itl_ms=st.lists(_MS, max_size=20).map(tuple),
            routes=st.dictionaries(_TEXT, st.integers(0, 10_000), max_size=4),
        ),
        max_size=3,
    ),
    decisions=st.lists(_DECISION, max_size=5).map(tuple),
)


@given(_WINDOW)
def test_a_window_round_trips(window: GatewayWindow) -> None:
    assert decode_window(encode_window(window)) == window


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"not compressed",
        zlib.compress(b"not json"),
        zlib.compress(b'{"format": 1}'),
        zlib.compress(b'{"format": 2, "gateway": "g"}'),
        zlib.compress(b"[1, 2]"),
    ],
)
def test_anything_else_is_malformed(blob: bytes) -> None:
    with pytest.raises(MalformedWindowError):
        decode_window(blob)


def _decision(at: float, gateway: str) -> DecisionRecord:
    return DecisionRecord(at, "m", "local", "r1", gateway, 10.0, 11.0, None)


def test_merge_pools_samples_adds_counts_and_rates_and_keeps_the_newest_decisions() -> None:
    a = GatewayWindow(
        "gw-a",
        300.0,
        {"m": ModelWindow((30.0, 10.0), (1.0,), {"local": 2})},
        (_decision(5.0, "gw-a"), _decision(1.0, "gw-a")),
    )
    b = GatewayWindow(
        "gw-b",
        60.0,  # a younger gateway: its rate is over its own span
        {"m": ModelWindow((20.0,), (), {"local": 1, "spill_over": 2})},
        (_decision(4.0, "gw-b"), _decision(3.0, "gw-b")),
    )
    merged = merge_windows([b, a, a], ["m", "other"], decisions=3)
    assert merged.gateways == ("gw-a", "gw-b")
    model = merged.models["m"]
    assert model.ttft_ms == [10.0, 20.0, 30.0]
    assert model.itl_ms == [1.0]
    assert model.routes == {"local": 3, "spill_over": 2}
    assert model.requests_per_min == pytest.approx(2 * 60 / 300 + 3 * 60 / 60)
    assert [d.at for d in merged.decisions] == [5.0, 4.0, 3.0]
    empty = merged.models["other"]  # a model no gateway has served
    assert (empty.ttft_ms, empty.routes, empty.requests_per_min) == ([], {}, 0.0)
