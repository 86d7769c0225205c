"""W2, multi-turn chat with a growing history (production-stack multi-round QA style).

Content: one system prompt of ``system_tokens`` tokens shared by *all* sessions. Turn 0
of a session is the system prompt plus a user message of ``user_tokens`` tokens; turn
``k + 1`` is turn ``k``'s prompt, then turn ``k``'s answer (``answer_tokens``), then a
new user message, so each prompt extends the previous one exactly and a replica that
kept the session's cache only prefills the new part. A turn's ``max_tokens`` is its
answer's length, so the simulator generates exactly the tokens the next turn replays.
Lengths are uniform in ``mean * (1 ± length_spread)``. Session ``i``'s content is the
same at every rate.

Arrivals are in seconds, as people chat: a session has ``turns`` turns ``think_s``
seconds apart on average (``think_distribution``: exponential, log-normal with shape
``think_sigma``, or constant), counted from one turn's arrival to the next — reading the
answer included; the trace is open loop, so a turn never waits for the previous answer.
Sessions start as a Poisson process at ``rate_rps / turns``, so requests arrive at
``rate_rps`` on average, and about ``rate_rps * think_s`` sessions are open at once: the
load decides how many histories compete for the KV caches, as in production.

The trace is a window of a process in its **steady state**: sessions start from
``warm_up_s = (2 * turns - 1) * think_s`` before time 0, and the first ``num_requests``
turns arriving at or after 0 are the trace. A session that began before 0 enters the
trace at a later turn with its whole history in the prompt (a cold, long prompt, as a
session already open when a router starts); the last sessions are cut off. The rate is
therefore flat from the first request instead of ramping up. Another rate draws the
same sessions at other times, so which turns fall in the window changes with it.

Called through the registry by :func:`firstlight_bench.workloads.generate`.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Literal

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
    jittered_length,
    random_tokens,
    skip_tokens,
    stream,
)

__all__ = ["MultiTurnParams", "generate_multi_turn"]


class MultiTurnParams(WorkloadParams):
    """Parameters of W2."""

    turns: Annotated[int, Field(ge=1, le=10_000)] = 6
    """Most turns per session."""
    system_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Length of the system prompt every session starts with, in tokens."""
    user_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 96
    """Mean length of a user message, in tokens."""
    answer_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 128
    """Mean length of an answer (a turn's ``max_tokens``), in tokens."""
    length_spread: Annotated[float, Field(ge=0, lt=1)] = 0.25
    """Message and answer lengths are uniform in ``mean * (1 ± length_spread)``."""
    think_s: Annotated[float, Field(gt=0, le=86_400)] = 10.0
    """Mean time between two turns of a session, in seconds (arrival to arrival)."""
    think_distribution: Literal["exponential", "lognormal", "constant"] = "exponential"
    """How think times vary around ``think_s``."""
    think_sigma: Annotated[float, Field(gt=0, le=5)] = 1.0
    """Shape of the log-normal think time (the standard deviation of its log); its mean
    stays ``think_s``."""
    vocab_size: Annotated[int, Field(ge=2, le=2**31)] = 32_000
    """Token ids are drawn uniformly from ``1..vocab_size-1``."""


def _session_contents(
    params: MultiTurnParams,
    turn_counts: list[int],
    regions: list[int],
    seed: int,
    last_turn: dict[int, int],
) -> dict[int, list[RequestContent]]:
    """The contents of each session's turns up to ``last_turn[session]`` (the turns in
    the trace). Sessions and turns outside it draw the same random numbers without
    building their tokens, so a trace does not depend on what is left out, and a short
    trace at a high rate does not build the prompts of thousands of warm-up sessions."""
    rng = stream(seed, "content")
    spread = params.length_spread
    system = random_tokens(rng, params.system_tokens, params.vocab_size)
    sessions = {}
    for session, (turns, region) in enumerate(zip(turn_counts, regions, strict=True)):
        history = system
        contents = []
        needed = last_turn.get(session, -1)
        for turn in range(turns):
            user_len = jittered_length(rng, params.user_tokens, spread)
            if turn > needed:
                skip_tokens(rng, user_len)
                skip_tokens(rng, jittered_length(rng, params.answer_tokens, spread))
                continue
            prompt = history + random_tokens(rng, user_len, params.vocab_size)
            answer_len = jittered_length(rng, params.answer_tokens, spread)
            contents.append(RequestContent(region, prompt, answer_len, 0, session, turn))
            history = prompt + random_tokens(rng, answer_len, params.vocab_size)
        if contents:
            sessions[session] = contents
    return sessions


def _think(rng: random.Random, params: MultiTurnParams) -> float:
    mean = params.think_s
    if params.think_distribution == "constant":
        return mean
    if params.think_distribution == "lognormal":
        sigma = params.think_sigma
        return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)
    return rng.expovariate(1 / mean)


def _arrivals(
    params: MultiTurnParams, shape: TraceShape, horizon_s: float
) -> list[tuple[float, int, int]]:
    """(arrival s, session, turn) of every turn at or after 0 of the sessions that start
    in ``[-warm_up_s, horizon_s)``, sorted."""
    rng = stream(shape.seed, "arrivals")
    start_rate = shape.rate_rps / params.turns
    start = -(2 * params.turns - 1) * params.think_s
    timed = []
    session = 0
    while True:
        start += rng.expovariate(start_rate)
        if start >= horizon_s:
            break
        arrival = start
        for turn in range(params.turns):
            if turn:
                arrival += _think(rng, params)
            if arrival >= 0:
                timed.append((arrival, session, turn))
        session += 1
    timed.sort()
    return timed


def generate_multi_turn(params: MultiTurnParams, shape: TraceShape) -> Trace:
    """W2: growing multi-turn sessions in steady state; Poisson session starts, think
    times in seconds (see the module docstring)."""
    n = shape.num_requests
    horizon = n / shape.rate_rps
    timed = _arrivals(params, shape, horizon)
    while len(timed) < n or timed[n - 1][0] >= horizon:
        # Later sessions only add later turns: extend until the n-th turn is settled.
        horizon *= 1.5
        timed = _arrivals(params, shape, horizon)
    timed = timed[:n]
    session_count = max(session for _, session, _ in timed) + 1
    regions = client_regions(shape.seed, session_count, shape.regions)
    turn_counts = [params.turns] * session_count
    last_turn: dict[int, int] = {}
    for _, session, turn in timed:
        last_turn[session] = max(turn, last_turn.get(session, -1))
    sessions = _session_contents(params, turn_counts, regions, shape.seed, last_turn)
    contents = [sessions[session][turn] for _, session, turn in timed]
    arrivals = [arrival * shape.rate_rps for arrival, _, _ in timed]
    derived = {
        "sessions": len({session for _, session, _ in timed}),
        "warm_up_s": (2 * params.turns - 1) * params.think_s,
        "session_start_rate_rps": shape.rate_rps / params.turns,
        "open_sessions": shape.rate_rps * params.think_s * (params.turns - 1) / params.turns,
    }
    return Trace(assemble("w2", arrivals, shape.rate_rps, contents), derived)
