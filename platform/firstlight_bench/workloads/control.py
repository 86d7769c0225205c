"""W3, the control: no sharing at all.

Each prompt is ``min_prompt_tokens..max_prompt_tokens`` random tokens (uniform length),
each output ``min_output_tokens..max_output_tokens`` tokens; arrivals are Poisson and
``prefix_group`` is ``None``. Prefix-aware routing can gain nothing here, so it must
show no regression against ``least_queue``. Called through the registry by
:func:`firstlight_bench.workloads.generate`.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, model_validator

from firstlight.config import FieldValueError
from firstlight_bench.workloads._model import (
    RequestContent,
    Trace,
    TraceShape,
    WorkloadParams,
    assemble,
)
from firstlight_bench.workloads._sampling import (
    client_regions,
    exponential_gaps,
    random_tokens,
    stream,
)

__all__ = ["ControlParams", "generate_control"]


class ControlParams(WorkloadParams):
    """Parameters of W3."""

    min_prompt_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Shortest prompt, in tokens."""
    max_prompt_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 2048
    """Longest prompt, in tokens (lengths are uniform in between)."""
    min_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 32
    """Fewest output tokens."""
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Most output tokens (uniform in between)."""
    vocab_size: Annotated[int, Field(ge=2, le=2**31)] = 32_000
    """Token ids are drawn uniformly from ``1..vocab_size-1``."""

    @model_validator(mode="after")
    def _ranges_are_ordered(self) -> Self:
        if self.max_prompt_tokens < self.min_prompt_tokens:
            raise FieldValueError(
                "max_prompt_tokens",
                self.max_prompt_tokens,
                f"must be >= min_prompt_tokens ({self.min_prompt_tokens})",
            )
        if self.max_output_tokens < self.min_output_tokens:
            raise FieldValueError(
                "max_output_tokens",
                self.max_output_tokens,
                f"must be >= min_output_tokens ({self.min_output_tokens})",
            )
        return self


def generate_control(params: ControlParams, shape: TraceShape) -> Trace:
    """W3: independent random prompts and outputs, Poisson arrivals."""
    rng = stream(shape.seed, "content")
    contents = []
    for region in client_regions(shape.seed, shape.num_requests, shape.regions):
        prompt_len = rng.randint(params.min_prompt_tokens, params.max_prompt_tokens)
        prompt = random_tokens(rng, prompt_len, params.vocab_size)
        max_tokens = rng.randint(params.min_output_tokens, params.max_output_tokens)
        contents.append(RequestContent(region, prompt, max_tokens, None))
    arrivals = exponential_gaps(stream(shape.seed, "arrivals"), shape.num_requests)
    return Trace(assemble("w3", arrivals, shape.rate_rps, contents), {})
