"""What a step of the simulator reports: :class:`StepResult` and :class:`FinishedRequest`.

Built by :meth:`SimCore.finish_step` (and :meth:`SimCore.abort`); read by the drivers
(:class:`SimEngine` turns them into chunks, the benchmark into TTFT/ITL samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from firstlight.engine.protocol import FinishReason, Usage

__all__ = ["FinishedRequest", "StepResult"]


class FinishedRequest(NamedTuple):
    """A request that left the core: finished, stopped or aborted."""

    request_id: str
    finish_reason: FinishReason
    usage: Usage


@dataclass(slots=True)
class StepResult:
    """What one step did; returned by :meth:`SimCore.finish_step`."""

    duration_s: float
    """Simulated duration of the step."""
    scheduled_tokens: int
    """Tokens computed (never more than ``max_num_batched_tokens``)."""
    prefill_tokens: int
    """Of those, prompt (or recomputed) tokens."""
    prefill_context: float
    """Sum of :meth:`SimProfile.prefill_context` over the step's prefill chunks (what
    ``prefill_ms_per_token_per_context`` multiplies)."""
    decode_seqs: int
    """Sequences that decoded one token."""
    scheduled_seqs: int
    """Requests in the batch (never more than ``max_num_seqs``)."""
    tokens: list[tuple[str, int]]
    """``(request id, token id)`` for each request that sampled a token at the end of the
    step, aborted requests left out."""
    first_token_ids: list[str]
    """Requests whose first token this step produced."""
    finished: list[FinishedRequest]
    """Requests that finished with this step's token (its last token is in ``tokens``)."""
    preempted: list[str]
    """Requests preempted (sent back to the waiting queue) when the step was scheduled."""
