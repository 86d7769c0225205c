"""W2, multi-turn chat with a growing history (production-stack multi-round QA style).

Content: one system prompt of ``system_tokens`` tokens shared by *all* sessions. Turn 0
of a session is the system prompt plus a user message of ``user_tokens`` tokens; turn
``k + 1`` is turn ``k``'s prompt, then turn ``k``'s answer (``answer_tokens``), then a
new user message, so each prompt extends the previous one exactly and a replica that
kept the session's cache only prefills the new part. A turn's ``max_tokens`` is its
answer's length, so the simulator generates exactly the tokens the next turn replays.
Lengths are uniform in ``mean * (1 ± length_spread)``.

Sessions: ``sessions`` of them (default ``ceil(num_requests / turns)``), the requests
split as evenly as possible, so each session has at most ``turns`` turns. Client
regions are drawn per session.

Arrivals, in normalized time (one unit = the mean gap ``1 / rate_rps``), divided by the
rate at the end so another rate only rescales them:

* the mean think time between two turns of a session is ``think_requests`` units, i.e.
  ``think_requests / rate_rps`` seconds (exponential). Expressed this way, the number of
  other requests that arrive in between, hence the cache pressure on a session's
  history, does not change with the load;
* sessions start as a Poisson process over a window of ``num_requests - (T - 1) *
  think_requests`` units (``T`` the mean turns per session; at least half the trace),
  so the last sessions finish about ``num_requests`` units in;
* finally all times are scaled by ``num_requests / (last arrival)`` (recorded as
  ``derived["time_scale"]``, within a few percent of 1 for a few thousand requests), so
  the last request arrives at exactly ``num_requests / rate_rps`` seconds and the
  overall mean rate is ``rate_rps``. Think times and session starts scale with it.

Called through the registry by :func:`firstlight_bench.workloads.generate`.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

from firstlight.errors import ConfigError, ConfigProblem
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
    stream,
)

__all__ = ["MultiTurnParams", "generate_multi_turn"]


class MultiTurnParams(WorkloadParams):
    """Parameters of W2."""

    sessions: Annotated[int | None, Field(ge=1, le=10_000_000)] = None
    """Number of sessions; ``None``: ``ceil(num_requests / turns)``. Must leave every
    session at least one and at most ``turns`` turns."""
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
    think_requests: Annotated[float, Field(ge=0, le=1_000_000)] = 20.0
    """Mean think time between two turns of a session, in mean inter-arrival times
    (``think_requests / rate_rps`` seconds: 2 s at 10 rps); about how many other
    requests arrive in between."""
    vocab_size: Annotated[int, Field(ge=2, le=2**31)] = 32_000
    """Token ids are drawn uniformly from ``1..vocab_size-1``."""


def _session_count(params: MultiTurnParams, num_requests: int) -> int:
    sessions = params.sessions or math.ceil(num_requests / params.turns)
    if sessions > num_requests:
        message = f"more sessions than requests ({num_requests}): a session needs a turn"
        raise ConfigError([ConfigProblem("W2.sessions", message, sessions, True)])
    if sessions * params.turns < num_requests:
        message = f"{params.turns} turns each cannot hold {num_requests} requests"
        raise ConfigError([ConfigProblem("W2.sessions", message, sessions, True)])
    return sessions


def _session_contents(
    params: MultiTurnParams, turn_counts: list[int], regions: list[int], seed: int
) -> list[list[RequestContent]]:
    rng = stream(seed, "content")
    spread = params.length_spread
    system = random_tokens(rng, params.system_tokens, params.vocab_size)
    sessions = []
    for session, (turns, region) in enumerate(zip(turn_counts, regions, strict=True)):
        history = system
        contents = []
        for turn in range(turns):
            user_len = jittered_length(rng, params.user_tokens, spread)
            prompt = history + random_tokens(rng, user_len, params.vocab_size)
            answer_len = jittered_length(rng, params.answer_tokens, spread)
            contents.append(RequestContent(region, prompt, answer_len, 0, session, turn))
            history = prompt + random_tokens(rng, answer_len, params.vocab_size)
        sessions.append(contents)
    return sessions


def generate_multi_turn(params: MultiTurnParams, shape: TraceShape) -> Trace:
    """W2: growing multi-turn sessions; Poisson session starts, exponential think times.

    Raises :class:`~firstlight.errors.ConfigError` when ``sessions`` cannot hold
    ``num_requests`` in at most ``turns`` turns each, or exceeds ``num_requests``.
    """
    n = shape.num_requests
    session_count = _session_count(params, n)
    base, extra = divmod(n, session_count)
    turn_counts = [base + (1 if s < extra else 0) for s in range(session_count)]
    regions = client_regions(shape.seed, session_count, shape.regions)
    sessions = _session_contents(params, turn_counts, regions, shape.seed)

    rng = stream(shape.seed, "arrivals")
    mean_turns = n / session_count
    window = max(n - (mean_turns - 1) * params.think_requests, n / 2)
    start_rate = session_count / window
    timed: list[tuple[float, int, int]] = []  # (arrival_u, session, turn)
    start = 0.0
    for session, turns in enumerate(turn_counts):
        start += rng.expovariate(start_rate)
        arrival = start
        for turn in range(turns):
            if turn and params.think_requests > 0:
                arrival += rng.expovariate(1 / params.think_requests)
            timed.append((arrival, session, turn))
    timed.sort()
    scale = n / timed[-1][0]
    contents = [sessions[session][turn] for _, session, turn in timed]
    arrivals = [arrival * scale for arrival, _, _ in timed]
    derived = {
        "sessions": session_count,
        "time_scale": scale,
        "mean_think_s": params.think_requests * scale / shape.rate_rps,
        "session_start_rate_rps": start_rate / scale * shape.rate_rps,
    }
    return Trace(assemble("w2", arrivals, shape.rate_rps, contents), derived)
