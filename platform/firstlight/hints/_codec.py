"""The Redis layout of the hints: key names, and how a block event is written to the feed.

One key space per ``(key_prefix, model)``; ``P`` = ``{key_prefix}hints:{model}``::

    P:r:{replica_id}      sorted set: member = block hash (decimal), score = wall-clock
                          time it was last stored; PEXPIRE ttl; members older than
                          ttl trimmed on every publish
    P:h:{replica_id}      sorted set of the replica's host-tier blocks (KV offloading),
                          same form: score = time it was last offloaded; only while the
                          replica has any
    P:epoch:{replica_id}  string: the replica's current epoch (decimal); PX ttl
    P:feed                stream (MAXLEN ~ bound; PEXPIRE ttl) of block events, fields:
                            v        format version, b"1"
                            replica  replica id (UTF-8)
                            epoch    decimal
                            at       publisher's wall-clock time (decimal seconds)
                            cleared  b"1" or b"0"
                            stored   block hashes, 8-byte big-endian unsigned, concatenated
                            removed  same packing
                            offloaded        same packing; absent when empty
                            offload_removed  same packing; absent when empty

The two host-tier fields were added without a new format version: an entry without
them decodes as before (no host-tier changes), and a reader that predates them ignores
them (it then misses only that an offloaded block left the device tier).
Used by the publisher (which writes all of it in one Lua script) and the subscriber
(which reads it back). Decoding never trusts the stream: anything unexpected raises
:class:`MalformedEntryError`, which the subscriber counts and skips.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from firstlight.errors import HintsError, InvalidBlockEventError
from firstlight.hints._events import MAX_BLOCK_HASH, BlockEvent

__all__ = [
    "FEED_FORMAT_VERSION",
    "HintKeys",
    "MalformedEntryError",
    "decode_feed_entry",
    "encode_feed_fields",
    "pack_hashes",
    "parse_epoch",
    "parse_member",
    "unpack_hashes",
]

FEED_FORMAT_VERSION = b"1"
_HASH = struct.Struct(">Q")
_GLOB_SPECIAL = frozenset("*?[]\\")


class MalformedEntryError(ValueError):
    """A feed entry or Redis value could not be decoded (internal: never escapes the
    subscriber, which counts and skips it)."""


@dataclass(frozen=True, slots=True)
class HintKeys:
    """Key names of one model's hints under one key prefix.

    Raises :class:`HintsError` when ``model`` is empty.
    """

    key_prefix: str
    model: str

    def __post_init__(self) -> None:
        if not self.model:
            raise HintsError(f"model = {self.model!r}: must be a non-empty model name")

    @property
    def base(self) -> str:
        """Common prefix of this model's keys: ``{key_prefix}hints:{model}:``."""
        return f"{self.key_prefix}hints:{self.model}:"

    @property
    def feed(self) -> str:
        """The change-feed stream."""
        return f"{self.base}feed"

    def replica_set(self, replica_id: str) -> str:
        """The sorted set of ``replica_id``'s blocks."""
        return f"{self.base}r:{replica_id}"

    def replica_host_set(self, replica_id: str) -> str:
        """The sorted set of ``replica_id``'s host-tier (offloaded) blocks."""
        return f"{self.base}h:{replica_id}"

    def replica_epoch(self, replica_id: str) -> str:
        """The key holding ``replica_id``'s current epoch."""
        return f"{self.base}epoch:{replica_id}"

    @property
    def replica_set_pattern(self) -> str:
        """SCAN ``MATCH`` pattern of every replica set of this model, device-tier
        (``r:``) and host-tier (``h:``) alike: a replica whose blocks all moved to its
        host tier has no device set left."""
        escaped = "".join(f"\\{c}" if c in _GLOB_SPECIAL else c for c in self.base)
        return f"{escaped}[rh]:*"

    def replica_of_set_key(self, key: bytes | str) -> str:
        """The replica id in a replica-set key (either tier); raises
        :class:`MalformedEntryError`."""
        text = _text(key, "key")
        for tier in ("r:", "h:"):
            head = f"{self.base}{tier}"
            if text.startswith(head) and len(text) > len(head):
                return text[len(head) :]
        raise MalformedEntryError(f"{text!r} is not a replica set key of {self.base!r}")


def pack_hashes(hashes: Sequence[int]) -> bytes:
    """Pack block hashes as concatenated 8-byte big-endian unsigned integers."""
    return struct.pack(f">{len(hashes)}Q", *hashes)


def unpack_hashes(data: bytes) -> tuple[int, ...]:
    """Inverse of :func:`pack_hashes`; raises :class:`MalformedEntryError` on a bad length."""
    if len(data) % _HASH.size:
        raise MalformedEntryError(f"packed hashes of {len(data)} bytes, not a multiple of 8")
    return struct.unpack(f">{len(data) // _HASH.size}Q", data)


def parse_member(member: bytes | str) -> int:
    """A sorted-set member (decimal block hash) as an int; raises :class:`MalformedEntryError`."""
    text = _text(member, "member")
    if not text.isdigit() or not text.isascii():
        raise MalformedEntryError(f"member {text!r} is not a decimal block hash")
    value = int(text)
    if value > MAX_BLOCK_HASH:
        raise MalformedEntryError(f"member {text!r} is not below 2**64")
    return value


def parse_epoch(raw: bytes | str) -> int:
    """A decimal epoch as an int; raises :class:`MalformedEntryError`."""
    text = _text(raw, "epoch")
    if not text.isdigit() or not text.isascii():
        raise MalformedEntryError(f"epoch {text!r} is not a non-negative decimal integer")
    return int(text)


def encode_feed_fields(event: BlockEvent, at: float) -> dict[str, bytes]:
    """The feed fields of ``event`` published at wall-clock time ``at``.

    The publisher sends the same values as script arguments; this form is for tests and
    tools that write the feed directly.
    """
    fields = {
        "v": FEED_FORMAT_VERSION,
        "replica": event.replica_id.encode(),
        "epoch": str(event.epoch).encode(),
        "at": repr(float(at)).encode(),
        "cleared": b"1" if event.cleared else b"0",
        "stored": pack_hashes(event.stored),
        "removed": pack_hashes(event.removed),
    }
    if event.offloaded:
        fields["offloaded"] = pack_hashes(event.offloaded)
    if event.offload_removed:
        fields["offload_removed"] = pack_hashes(event.offload_removed)
    return fields


def decode_feed_entry(fields: Mapping[bytes, bytes]) -> tuple[BlockEvent, float]:
    """Decode one feed entry into ``(event, published at)``.

    Called by the subscriber for every entry it reads. Raises :class:`MalformedEntryError`
    for a missing field, an unknown format version, bad packing or an invalid event.
    """
    version = fields.get(b"v")
    if version != FEED_FORMAT_VERSION:
        raise MalformedEntryError(f"unknown feed format version {version!r}")
    try:
        replica = _text(fields[b"replica"], "replica")
        epoch = parse_epoch(fields[b"epoch"])
        at = float(_text(fields[b"at"], "at"))
        cleared_raw = fields[b"cleared"]
        stored = unpack_hashes(fields[b"stored"])
        removed = unpack_hashes(fields[b"removed"])
        offloaded = unpack_hashes(fields.get(b"offloaded", b""))
        offload_removed = unpack_hashes(fields.get(b"offload_removed", b""))
    except KeyError as exc:
        raise MalformedEntryError(f"missing field {exc.args[0]!r}") from None
    except ValueError as exc:  # includes MalformedEntryError, float() and UTF-8 errors
        raise MalformedEntryError(str(exc)) from None
    if cleared_raw not in (b"0", b"1"):
        raise MalformedEntryError(f"cleared = {cleared_raw!r}, expected b'0' or b'1'")
    if not math.isfinite(at):
        raise MalformedEntryError(f"at = {at!r} is not a finite time")
    try:
        event = BlockEvent(
            replica, epoch, stored, removed, cleared_raw == b"1", offloaded, offload_removed
        )
    except InvalidBlockEventError as exc:
        raise MalformedEntryError(str(exc)) from None
    return event, at


def _text(raw: bytes | str, what: str) -> str:
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, bytes):
        raise MalformedEntryError(f"{what} {raw!r} is not bytes")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise MalformedEntryError(f"{what} {raw!r} is not UTF-8") from None
