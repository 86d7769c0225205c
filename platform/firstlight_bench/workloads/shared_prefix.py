"""W1 shared prefix, W4 Zipf-hot prefixes, W5 bursty arrivals and W8's mixed fleet: one
content family.

Content (SGLang's ``generated-shared-prefix`` benchmark): ``groups`` system prompts of
``system_tokens`` random tokens; each request is one group's system prompt followed by
a fresh question of ``question_tokens`` tokens (± ``length_spread``, uniform) and asks
for ``output_tokens`` tokens (± ``length_spread``). W1 and W5 pick the group uniformly,
W4 from a Zipf law (group 0 hottest). With equal parameters and seed, W1 and W5 have
identical content, so comparing them isolates the effect of bursts.

Arrivals: W1 and W4 are Poisson (exponential gaps); W5 has Gamma gaps of shape
``burstiness`` with the same mean, so their coefficient of variation is
``1 / sqrt(burstiness)`` (bursty below 1).

The generators are called by :func:`firstlight_bench.workloads.generate` through the
registry; :func:`system_prompts` and :func:`question_request` are reused by W6.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Annotated

from pydantic import Field

from firstlight_bench.workloads._model import (
    RequestContent,
    Trace,
    TraceShape,
    WorkloadParams,
    assemble,
)
from firstlight_bench.workloads._sampling import (
    client_regions,
    draw_rank,
    exponential_gaps,
    gamma_gaps,
    jittered_length,
    random_tokens,
    stream,
    zipf_cumulative_weights,
)

__all__ = [
    "MIXED_FLEET",
    "BurstyParams",
    "SharedPrefixParams",
    "ZipfPrefixParams",
    "generate_bursty",
    "generate_mixed_fleet",
    "generate_shared_prefix",
    "generate_zipf_prefix",
    "question_request",
    "system_prompts",
]


class SharedPrefixParams(WorkloadParams):
    """Parameters of W1 (and the base of W4, W5 and W6)."""

    groups: Annotated[int, Field(ge=1, le=100_000)] = 64
    """Number of distinct system prompts (shared prefixes)."""
    system_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    """Length of each system prompt in tokens."""
    question_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 64
    """Mean length of the question that follows the system prompt, in tokens."""
    output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 128
    """Mean number of output tokens (``max_tokens``)."""
    length_spread: Annotated[float, Field(ge=0, lt=1)] = 0.25
    """Question and output lengths are uniform in ``mean * (1 ± length_spread)``."""
    vocab_size: Annotated[int, Field(ge=2, le=2**31)] = 32_000
    """Token ids are drawn uniformly from ``1..vocab_size-1``."""


class ZipfPrefixParams(SharedPrefixParams):
    """Parameters of W4: W1's, with more groups and Zipf-distributed popularity."""

    groups: Annotated[int, Field(ge=1, le=100_000)] = 256
    """Number of distinct system prompts; group ``k`` has popularity rank ``k + 1``."""
    zipf_s: Annotated[float, Field(gt=0, le=10)] = 1.1
    """Zipf exponent: ``P(group k) ∝ 1 / (k + 1) ** zipf_s`` (rank 1 is ``2 ** zipf_s``
    times as popular as rank 2)."""


class BurstyParams(SharedPrefixParams):
    """Parameters of W5: W1's content with Gamma-distributed inter-arrival times."""

    burstiness: Annotated[float, Field(gt=0, le=100)] = 0.25
    """Shape of the Gamma inter-arrival distribution (mean ``1 / rate_rps``); the gaps'
    coefficient of variation is ``1 / sqrt(burstiness)``: 1 is Poisson, below 1 bursty."""


def system_prompts(
    rng: random.Random, count: int, params: SharedPrefixParams
) -> list[tuple[int, ...]]:
    """``count`` random system prompts of ``params.system_tokens`` tokens."""
    return [random_tokens(rng, params.system_tokens, params.vocab_size) for _ in range(count)]


def question_request(
    rng: random.Random,
    system_prompt: tuple[int, ...],
    group: int,
    client_region: int,
    params: SharedPrefixParams,
) -> RequestContent:
    """``system_prompt`` plus a fresh question, with a jittered output length."""
    question_len = jittered_length(rng, params.question_tokens, params.length_spread)
    question = random_tokens(rng, question_len, params.vocab_size)
    max_tokens = jittered_length(rng, params.output_tokens, params.length_spread)
    return RequestContent(client_region, system_prompt + question, max_tokens, group)


def _contents(
    params: SharedPrefixParams, shape: TraceShape, pick_group: Callable[[random.Random], int]
) -> list[RequestContent]:
    rng = stream(shape.seed, "content")
    prompts = system_prompts(rng, params.groups, params)
    contents = []
    for region in client_regions(shape.seed, shape.num_requests, shape.regions):
        group = pick_group(rng)
        contents.append(question_request(rng, prompts[group], group, region, params))
    return contents


def generate_shared_prefix(params: SharedPrefixParams, shape: TraceShape) -> Trace:
    """W1: uniform groups, Poisson arrivals."""
    contents = _contents(params, shape, lambda rng: rng.randrange(params.groups))
    arrivals = exponential_gaps(stream(shape.seed, "arrivals"), shape.num_requests)
    return Trace(assemble("w1", arrivals, shape.rate_rps, contents), {})


def generate_zipf_prefix(params: ZipfPrefixParams, shape: TraceShape) -> Trace:
    """W4: Zipf-distributed groups, Poisson arrivals."""
    weights = zipf_cumulative_weights(params.groups, params.zipf_s)
    contents = _contents(params, shape, lambda rng: draw_rank(rng, weights))
    arrivals = exponential_gaps(stream(shape.seed, "arrivals"), shape.num_requests)
    derived = {"rank1_share": weights[0] / weights[-1]}
    return Trace(assemble("w4", arrivals, shape.rate_rps, contents), derived)


MIXED_FLEET = (
    "h100-llama-8b*16;h100-llama-8b*8+a100-llama-8b*8;a100-llama-8b*16;"
    "a100-llama-8b*8+l4-llama-8b*8"
)
"""W8's fleet, as multi-region fleets are bought: one region of H100s, one half H100 and
half A100, one of A100s, one half A100 and half L4 (the simulator's profiles)."""


def generate_mixed_fleet(params: SharedPrefixParams, shape: TraceShape) -> Trace:
    """W8: W1's content and arrivals, for the mixed fleet (:data:`MIXED_FLEET`)."""
    contents = _contents(params, shape, lambda rng: rng.randrange(params.groups))
    arrivals = exponential_gaps(stream(shape.seed, "arrivals"), shape.num_requests)
    return Trace(assemble("w8", arrivals, shape.rate_rps, contents), {"fleet": MIXED_FLEET})


def generate_bursty(params: BurstyParams, shape: TraceShape) -> Trace:
    """W5: uniform groups (W1's content), Gamma arrivals."""
    contents = _contents(params, shape, lambda rng: rng.randrange(params.groups))
    arrivals = gamma_gaps(stream(shape.seed, "arrivals"), shape.num_requests, params.burstiness)
    derived = {"interarrival_cv": params.burstiness**-0.5}
    return Trace(assemble("w5", arrivals, shape.rate_rps, contents), derived)
