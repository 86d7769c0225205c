"""The Redis layout: key names, hash packing, and decoding of feed entries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstlight.errors import HintsError, InvalidBlockEventError
from firstlight.hints import MAX_BLOCK_HASH, BlockEvent, HintKeys
from firstlight.hints._codec import (
    MalformedEntryError,
    decode_feed_entry,
    encode_feed_fields,
    pack_hashes,
    parse_epoch,
    parse_member,
    unpack_hashes,
)

block_hashes = st.lists(st.integers(0, MAX_BLOCK_HASH), max_size=50).map(tuple)


@given(block_hashes)
def test_packing_round_trips_and_takes_eight_bytes_per_hash(hashes: tuple[int, ...]) -> None:
    packed = pack_hashes(hashes)
    assert len(packed) == 8 * len(hashes)
    assert unpack_hashes(packed) == hashes


@given(
    st.text(min_size=1, max_size=40),
    st.integers(0, 2**40),
    block_hashes,
    block_hashes,
    st.booleans(),
    st.floats(0, 4e9),
)
def test_feed_entries_round_trip(
    replica: str,
    epoch: int,
    stored: tuple[int, ...],
    removed: tuple[int, ...],
    cleared: bool,
    at: float,
) -> None:
    event = BlockEvent(replica, epoch, stored, removed, cleared)
    fields = {k.encode(): v for k, v in encode_feed_fields(event, at).items()}
    assert decode_feed_entry(fields) == (event, at)


@given(
    st.integers(0, 2**40),
    block_hashes,
    block_hashes,
    block_hashes,
    block_hashes,
    st.floats(0, 4e9),
)
def test_feed_entries_round_trip_the_host_tier(
    epoch: int,
    stored: tuple[int, ...],
    removed: tuple[int, ...],
    offloaded: tuple[int, ...],
    offload_removed: tuple[int, ...],
    at: float,
) -> None:
    event = BlockEvent("r1", epoch, stored, removed, False, offloaded, offload_removed)
    fields = {k.encode(): v for k, v in encode_feed_fields(event, at).items()}
    assert decode_feed_entry(fields) == (event, at)
    # Empty host-tier tuples are left out, so entries without them stay as they were.
    assert (b"offloaded" in fields) == bool(offloaded)
    assert (b"offload_removed" in fields) == bool(offload_removed)


def test_entries_written_before_the_host_tier_decode_with_no_host_changes() -> None:
    old = {
        b"v": b"1",
        b"replica": b"r1",
        b"epoch": b"3",
        b"at": b"12.5",
        b"cleared": b"0",
        b"stored": pack_hashes((1, 2)),
        b"removed": pack_hashes((3,)),
    }
    event, at = decode_feed_entry(old)
    assert event == BlockEvent("r1", 3, (1, 2), (3,))
    assert event.offloaded == ()
    assert event.offload_removed == ()
    assert at == 12.5


@pytest.mark.parametrize("field", [b"offloaded", b"offload_removed"])
def test_a_badly_packed_host_tier_field_is_malformed(field: bytes) -> None:
    fields = _valid()
    fields[field] = b"\x00" * 7
    with pytest.raises(MalformedEntryError, match="multiple of 8"):
        decode_feed_entry(fields)


def test_host_tier_hashes_are_validated_like_the_others() -> None:
    with pytest.raises(InvalidBlockEventError, match="offloaded"):
        BlockEvent("r1", 0, (), (), offloaded=(2**64,))
    with pytest.raises(InvalidBlockEventError, match="offload_removed"):
        BlockEvent("r1", 0, (), (), offload_removed=[1])  # type: ignore[arg-type]


def _valid() -> dict[bytes, bytes]:
    event = BlockEvent("r1", 2, (1, 2), (3,))
    return {k.encode(): v for k, v in encode_feed_fields(event, 1.5).items()}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        pytest.param(b"v", b"2", "version", id="unknown-version"),
        pytest.param(b"v", None, "version", id="no-version"),
        pytest.param(b"replica", None, "missing field", id="no-replica"),
        pytest.param(b"replica", b"\xff\xfe", "UTF-8", id="replica-not-utf8"),
        pytest.param(b"replica", b"", "replica_id", id="empty-replica"),
        pytest.param(b"epoch", b"-1", "epoch", id="negative-epoch"),
        pytest.param(b"epoch", b"one", "epoch", id="epoch-not-a-number"),
        pytest.param(b"at", b"soon", "could not convert", id="at-not-a-number"),
        pytest.param(b"at", b"nan", "finite", id="at-nan"),
        pytest.param(b"cleared", b"yes", "cleared", id="cleared-not-0-or-1"),
        pytest.param(b"stored", b"\x00" * 7, "multiple of 8", id="stored-bad-length"),
        pytest.param(b"removed", None, "missing field", id="no-removed"),
    ],
)
def test_malformed_feed_entries_are_rejected(
    field: bytes, value: bytes | None, message: str
) -> None:
    fields = _valid()
    if value is None:
        del fields[field]
    else:
        fields[field] = value
    with pytest.raises(MalformedEntryError, match=message):
        decode_feed_entry(fields)


@pytest.mark.parametrize(
    ("member", "expected"),
    [(b"0", 0), (b"42", 42), (str(MAX_BLOCK_HASH).encode(), MAX_BLOCK_HASH), ("7", 7)],
)
def test_set_members_parse(member: bytes | str, expected: int) -> None:
    assert parse_member(member) == expected


@pytest.mark.parametrize(
    "member", [b"", b"-1", b"1.5", b"abc", str(2**64).encode(), b"\xff", "\u0663".encode()]
)
def test_malformed_set_members_are_rejected(member: bytes) -> None:
    with pytest.raises(MalformedEntryError):
        parse_member(member)


@pytest.mark.parametrize("raw", [b"", b"-2", b"x", b"1e3"])
def test_malformed_epochs_are_rejected(raw: bytes) -> None:
    with pytest.raises(MalformedEntryError):
        parse_epoch(raw)


def test_key_layout() -> None:
    keys = HintKeys("firstlight:", "SmolLM2")
    assert keys.feed == "firstlight:hints:SmolLM2:feed"
    assert keys.replica_set("us-east/SmolLM2/replica-3") == (
        "firstlight:hints:SmolLM2:r:us-east/SmolLM2/replica-3"
    )
    assert keys.replica_epoch("r1") == "firstlight:hints:SmolLM2:epoch:r1"
    assert keys.replica_of_set_key(b"firstlight:hints:SmolLM2:r:a/b") == "a/b"
    with pytest.raises(MalformedEntryError):
        keys.replica_of_set_key(b"firstlight:hints:SmolLM2:r:")
    with pytest.raises(MalformedEntryError):
        keys.replica_of_set_key(b"firstlight:hints:Other:r:a")


def test_scan_pattern_escapes_glob_characters() -> None:
    assert HintKeys("p*[x]?:", "m").replica_set_pattern == "p\\*\\[x\\]\\?:hints:m:[rh]:*"


def test_host_tier_sets_are_keyed_apart_and_name_their_replica() -> None:
    keys = HintKeys("firstlight:", "SmolLM2")
    assert keys.replica_host_set("a/b") == "firstlight:hints:SmolLM2:h:a/b"
    assert keys.replica_host_set("a/b") != keys.replica_set("a/b")
    assert keys.replica_of_set_key(b"firstlight:hints:SmolLM2:h:a/b") == "a/b"
    with pytest.raises(MalformedEntryError):
        keys.replica_of_set_key(b"firstlight:hints:SmolLM2:h:")


def test_model_must_be_named() -> None:
    with pytest.raises(HintsError, match="model"):
        HintKeys("p:", "")
