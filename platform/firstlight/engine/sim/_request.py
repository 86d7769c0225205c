"""A request's mutable state inside :class:`SimCore` (private to the core)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DONE", "RUNNING", "WAITING", "SimRequest"]

WAITING, RUNNING, DONE = 0, 1, 2
"""Values of :attr:`SimRequest.state`."""


class SimRequest:
    """A request's state inside the core (one object per request, mutated in place)."""

    __slots__ = (
        "admitted",
        "cacheable",
        "cached_tokens",
        "computed",
        "generated",
        "hashes",
        "held",
        "max_tokens",
        "offset",
        "pending",
        "prompt_len",
        "refs",
        "request_id",
        "state",
        "stop_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_len: int,
        max_tokens: int,
        hashes: Sequence[int],
        block_size: int,
    ) -> None:
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.hashes = hashes
        self.cacheable = len(hashes) * block_size  # tokens in the prompt's full blocks
        self.state = WAITING
        self.admitted = False
        self.computed = 0  # tokens whose KV is computed
        self.generated = 0  # output tokens sampled
        self.held = 0  # KV blocks held: len(refs) cached + the rest private
        self.refs: list[int] = []  # cached blocks referenced, leading block first
        self.cached_tokens = 0  # prefix hit at first admission (Usage)
        self.pending = 0  # this request's share of pending_prefill_tokens
        self.offset = 0
        self.stop_ids: frozenset[int] = frozenset()
