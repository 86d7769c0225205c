"""A router's own record of the work it sent to each replica and has not seen finish.

The token-load routers (llm-d's ``inflight-load-producer``, NVIDIA Dynamo's
``ActiveSequences``) do not read the engines' queues: they count what they routed.
:class:`InFlight` is that count, fed by a policy's hooks: ``add`` on ``on_routed``,
``prefill_done`` on ``on_first_token`` (the first token ends the prefill) and ``done``
on ``on_done`` (the region core calls it when a request ends, whatever the outcome, and
for routes it stops tracking). Used by the ``llmd_sticky`` and ``dynamo_kv`` baselines
and by ``firstlight``'s memory term. Pure; O(blocks of the request) per call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["InFlight"]


@dataclass(slots=True)
class _Sent:
    replica_id: str
    prefill_tokens: int
    """Uncached prompt tokens still to prefill; 0 once the first token came."""
    blocks: tuple[int, ...]
    partial_blocks: int


class InFlight:
    """Per replica: prefill tokens in flight, and the KV blocks of the requests in flight
    (each distinct block counted once, as one replica holds it once)."""

    def __init__(self) -> None:
        self._sent: dict[str, _Sent] = {}
        self._prefill: dict[str, int] = {}
        self._blocks: dict[str, Counter[int]] = {}
        self._partial: dict[str, int] = {}
        self._requests: dict[str, int] = {}

    def add(
        self,
        replica_id: str,
        request_id: str,
        prefill_tokens: int,
        blocks: Sequence[int] = (),
        partial_blocks: int = 0,
    ) -> None:
        """``request_id`` was sent to ``replica_id`` with ``prefill_tokens`` to compute
        and a prompt of ``blocks`` (full-block hashes) plus ``partial_blocks`` more."""
        self.done(request_id)
        sent = _Sent(replica_id, prefill_tokens, tuple(blocks), partial_blocks)
        self._sent[request_id] = sent
        self._prefill[replica_id] = self._prefill.get(replica_id, 0) + prefill_tokens
        self._blocks.setdefault(replica_id, Counter()).update(sent.blocks)
        self._partial[replica_id] = self._partial.get(replica_id, 0) + partial_blocks
        self._requests[replica_id] = self._requests.get(replica_id, 0) + 1

    def prefill_done(self, request_id: str) -> None:
        """The request's first token came: its prefill no longer loads the replica."""
        sent = self._sent.get(request_id)
        if sent is not None and sent.prefill_tokens:
            self._prefill[sent.replica_id] -= sent.prefill_tokens
            sent.prefill_tokens = 0

    def done(self, request_id: str) -> str | None:
        """The request ended: release everything it held; returns the replica it was on
        (``None`` for a request not in flight)."""
        self.prefill_done(request_id)
        sent = self._sent.pop(request_id, None)
        if sent is None:
            return None
        blocks = self._blocks[sent.replica_id]
        for block in sent.blocks:
            left = blocks[block] - 1
            if left > 0:
                blocks[block] = left
            else:
                del blocks[block]
        self._partial[sent.replica_id] -= sent.partial_blocks
        self._requests[sent.replica_id] -= 1
        return sent.replica_id

    def requests(self, replica_id: str) -> int:
        """Requests sent to ``replica_id`` that have not ended."""
        return self._requests.get(replica_id, 0)

    def prefill_tokens(self, replica_id: str) -> int:
        """Prefill tokens sent to ``replica_id`` whose first token has not come."""
        return self._prefill.get(replica_id, 0)

    def active_blocks(self, replica_id: str) -> int:
        """Distinct KV blocks of the requests in flight on ``replica_id``."""
        blocks = self._blocks.get(replica_id)
        return (len(blocks) if blocks else 0) + self._partial.get(replica_id, 0)

    def new_blocks(self, replica_id: str, blocks: Sequence[int], partial_blocks: int) -> int:
        """Blocks of a prompt that ``replica_id``'s requests in flight do not hold."""
        held = self._blocks.get(replica_id)
        if not held:
            return len(blocks) + partial_blocks
        return sum(1 for block in blocks if block not in held) + partial_blocks

    def __len__(self) -> int:
        return len(self._sent)
