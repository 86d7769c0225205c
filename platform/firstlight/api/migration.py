"""Resuming a request on another replica after its replica failed.

Called by :class:`~firstlight.api.gateway.GatewayCore`: before the first token a failed
attempt is simply sent again (the request router picks a replica, now knowing the
failure); after output started, the request is *continued*: the prompt plus the tokens
already sent become the new prompt, ``max_tokens`` shrinks by as much, and
``resumed_tokens`` tells a deterministic engine where it is. The router prefers a
replica holding that prefix, so the resumed prefill is mostly cached. The client's
stream goes on with the new replica's tokens — no error, nothing repeated or missing
(exactly so with greedy decoding or the deterministic simulator).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from firstlight.engine.protocol import GenerationRequest, Usage
from firstlight.prefix import HashScheme, hint_hashes
from firstlight.routing import RequestView

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Attempts", "continuation", "merged_usage"]


@dataclass
class Attempts:
    """How many replica attempts one request has used, against ``limit``."""

    limit: int
    used: int = 1
    failures: list[str] = field(default_factory=list)

    def another(self, reason: str) -> bool:
        """Record a failed attempt; ``True`` if one more may be made."""
        self.failures.append(reason)
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def summary(self) -> str:
        """What went wrong, for the error the client gets after the last attempt."""
        return f"{self.used} attempt(s) failed: " + "; ".join(self.failures[-3:])


def continuation(
    original: GenerationRequest, generated: Sequence[int], scheme: HashScheme
) -> tuple[GenerationRequest, RequestView]:
    """``original`` resumed after ``generated`` output tokens, and its routing view."""
    prompt = original.prompt_token_ids + tuple(generated)
    sampling = replace(original.sampling, max_tokens=original.sampling.max_tokens - len(generated))
    request = replace(
        original,
        prompt_token_ids=prompt,
        sampling=sampling,
        resumed_tokens=original.resumed_tokens + len(generated),
    )
    routing = RequestView(
        request_id=original.request_id,
        prompt_tokens=len(prompt),
        block_hashes=hint_hashes(prompt, scheme, cache_salt=original.cache_salt),
        block_size=scheme.block_size,
    )
    return request, routing


def merged_usage(last: Usage | None, prompt_tokens: int, completion_tokens: int) -> Usage | None:
    """The usage the client sees for a resumed request: the original prompt and every
    token it received, whatever each attempt counted."""
    if last is None:
        return None
    cached = min(last.cached_prompt_tokens, prompt_tokens)
    return Usage(prompt_tokens, completion_tokens, cached)
