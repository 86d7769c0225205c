"""What the prefix-cache advisor learns from one request served in this region.

:class:`~firstlight.api.in_region.LocalServer` calls :func:`prompt_sample` at a request's
first token (while its route is still known) and :func:`with_usage` when the engine's
usage arrives; the telemetry hands the sample to its
:class:`~firstlight.advisor.PrefixAdvisor` when the request ends well.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from firstlight.advisor import PromptSample

if TYPE_CHECKING:
    from firstlight.api.in_region import Prepared
    from firstlight.engine.protocol import Usage
    from firstlight.region.state import Route, RouterState

__all__ = ["prompt_sample", "with_usage"]


def prompt_sample(
    prepared: Prepared, group: str, routed: Route | None, state: RouterState | None
) -> PromptSample:
    """The sample of ``prepared``, routed as ``routed`` by ``state``'s policy. Cached
    tokens start as the router's prediction; held tokens are known only where the
    policy predicts TTFT (it looks up every candidate's cached prefix)."""
    routing = prepared.routing
    size = routing.block_size
    cached = 0
    held: int | None = None
    ms_per_token: float | None = None
    chosen = routed.chosen if routed is not None else None
    if chosen is not None and routed is not None:
        cached = min(chosen.cached_blocks * size, routing.prompt_tokens)
        terms = chosen.terms
        if terms is not None and terms.uncached_tokens > 0:
            ms_per_token = terms.prefill_ms / terms.uncached_tokens
        elif state is not None:
            view = state.replicas.get(chosen.replica_id)
            if view is not None and view.prefill_tokens_per_s:
                ms_per_token = 1000.0 / view.prefill_tokens_per_s
        if state is not None and state.policy.predicts_ttft:
            most = max(c.cached_blocks for c in routed.decision.ranked)
            held = min(most * size, routing.prompt_tokens)
    return PromptSample(
        group=group,
        model=prepared.model.name,
        token_ids=prepared.generation.prompt_token_ids,
        block_hashes=routing.block_hashes,
        block_size=size,
        prompt_tokens=routing.prompt_tokens,
        cached_tokens=cached,
        held_tokens=held,
        ms_per_token=ms_per_token,
    )


def with_usage(sample: PromptSample | None, usage: Usage | None) -> PromptSample | None:
    """``sample`` with the cached tokens the engine reported (unchanged without usage)."""
    if sample is None or usage is None:
        return sample
    return replace(sample, cached_tokens=usage.cached_prompt_tokens)
