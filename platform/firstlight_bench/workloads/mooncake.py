"""W7, a real production trace: the Mooncake FAST'25 conversation trace, replayed.

The trace (``kvcache-ai/Mooncake``, ``FAST25-release/traces/conversation_trace.jsonl``,
Apache-2.0; one hour of Kimi's service) has one JSON object per request: ``timestamp``
(ms from the start), ``input_length``, ``output_length`` and ``hash_ids``, the prompt's
512-token prefix blocks as remapped ids (equal ids at equal positions are a shared
prefix). It carries no text. Its path is the parameter ``trace``: the product does not
ship it.

Replay:

* **Window.** ``num_requests`` consecutive requests, starting at row
  ``seed * stride mod (rows - num_requests + 1)`` (``stride`` 1,499, coprime with the
  trace's length), so each seed replays another stretch of the hour.
* **Arrivals.** The window's own timestamps, scaled so the mean rate is ``rate_rps``
  (bursts and lulls kept, compressed or stretched uniformly): in normalized time,
  ``u_i = (t_i - t_0) / (t_last - t_0) * num_requests``.
* **Tokens.** Each id becomes a deterministic block of 512 token ids (the same id, the
  same tokens, at every seed), so the engines' own block hashing sees exactly the
  sharing the trace records; a prompt's last block is cut to its ``input_length``.
  Prompts longer than ``max_prompt_tokens`` keep their first ``max_prompt_tokens``
  tokens (their prefix, hence their sharing) and outputs are capped at
  ``max_output_tokens``: the simulated 8B profile's context is 32,768 tokens while the
  trace's longest prompt is ~126,000. How many were cut is in ``derived``.
* **Client regions.** By conversation: the id of a prompt's second block (its first is
  the system prompt every request shares) hashed with the seed, so a conversation's
  turns come from one region. With ``move_probability`` > 0 users move: at each later
  request of a conversation, with that probability (a hash of the seed, the conversation
  and the request's turn in the window), it moves to another region, drawn uniformly,
  and stays there until it moves again — a traveller, a phone that changed networks, a
  latency DNS answer that changed. Its history is then cached only where it was served
  (the warm region, :mod:`firstlight.region.warm`).

Called through the registry by :func:`firstlight_bench.workloads.generate`; reading or
parsing the file fails with a :class:`~firstlight.errors.ConfigError` naming
``W7.trace``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from firstlight.errors import ConfigError, ConfigProblem
from firstlight_bench.workloads._model import (
    RequestContent,
    Trace,
    TraceShape,
    WorkloadParams,
    assemble,
)
from firstlight_bench.workloads._sampling import random_tokens, stream

__all__ = ["BLOCK_TOKENS", "MooncakeParams", "generate_mooncake"]

BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in the Mooncake traces."""
_STRIDE = 1499


class MooncakeParams(WorkloadParams):
    """Parameters of W7."""

    trace: Annotated[str, Field(min_length=1, max_length=4096)] = ""
    """Path of a Mooncake trace (JSON lines: ``timestamp``, ``input_length``,
    ``output_length``, ``hash_ids``). Required."""
    max_prompt_tokens: Annotated[int, Field(ge=BLOCK_TOKENS, le=1_000_000)] = 30_000
    """Longer prompts keep their first this many tokens."""
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 2_048
    """Longer outputs are capped at this many tokens."""
    vocab_size: Annotated[int, Field(ge=2, le=2**31)] = 32_000
    """Block token ids are drawn uniformly from ``1..vocab_size-1``."""
    move_probability: Annotated[float, Field(ge=0, le=1)] = 0.0
    """With several regions: the chance that a conversation's next request comes from
    another region than its last one (it stays there after)."""


def _problem(message: str, value: object) -> ConfigError:
    return ConfigError([ConfigProblem("W7.trace", message, value, True)])


def _row(line: str, number: int, path: str) -> tuple[float, int, int, list[int]]:
    try:
        data: Any = json.loads(line)
        row = (
            float(data["timestamp"]),
            int(data["input_length"]),
            int(data["output_length"]),
            [int(h) for h in data["hash_ids"]],
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise _problem(f"line {number}: not a Mooncake trace record ({exc})", path) from exc
    if row[1] < 1 or row[2] < 1 or not row[3]:
        raise _problem(f"line {number}: lengths must be >= 1 and hash_ids non-empty", path)
    return row


def read_trace(path: str) -> list[tuple[float, int, int, list[int]]]:
    """The trace's rows (timestamp ms, input length, output length, block ids)."""
    if not path:
        raise _problem("a trace file is required: --param trace=PATH", path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _problem(f"cannot read the trace: {exc}", path) from exc
    return [_row(line, i + 1, path) for i, line in enumerate(text.splitlines()) if line.strip()]


def _draw(*key: object) -> int:
    digest = hashlib.sha256("/".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _region(seed: int, conversation: int, regions: int) -> int:
    if regions == 1:
        return 0
    return _draw("w7", seed, conversation) % regions


def _moved(
    seed: int, conversation: int, turn: int, region: int, regions: int, probability: float
) -> int:
    """The region of a conversation's ``turn``-th request in the window, given the last
    one's (module docstring, "Client regions")."""
    if regions == 1 or turn == 0 or probability <= 0:
        return region
    if _draw("w7-move", seed, conversation, turn) / 2**64 >= probability:
        return region
    step = 1 + _draw("w7-where", seed, conversation, turn) % (regions - 1)
    return (region + step) % regions


def generate_mooncake(params: MooncakeParams, shape: TraceShape) -> Trace:
    """W7: a window of the trace, its arrivals scaled to the rate (module docstring)."""
    rows = read_trace(params.trace)
    n = shape.num_requests
    if len(rows) < n:
        raise _problem(f"holds {len(rows)} requests, fewer than num_requests = {n}", params.trace)
    start = shape.seed * _STRIDE % (len(rows) - n + 1)
    window = sorted(rows[start : start + n], key=lambda row: row[0])
    first, last = window[0][0], window[-1][0]
    span = last - first
    arrivals = [
        (t - first) / span * n if span > 0 else float(i) for i, (t, *_) in enumerate(window)
    ]
    blocks: dict[int, tuple[int, ...]] = {}
    cut_prompts = cut_outputs = 0
    contents = []
    # Conversation -> (its requests so far in the window, the region of the last one).
    where: dict[int, tuple[int, int]] = {}
    moves = 0
    for _, input_length, output_length, ids in window:
        tokens: list[int] = []
        for block_id in ids:
            block = blocks.get(block_id)
            if block is None:
                rng = stream(block_id, "w7-block")
                block = blocks[block_id] = random_tokens(rng, BLOCK_TOKENS, params.vocab_size)
            tokens.extend(block)
        prompt_length = min(input_length, params.max_prompt_tokens)
        cut_prompts += prompt_length < input_length
        cut_outputs += output_length > params.max_output_tokens
        conversation = ids[1] if len(ids) > 1 else ids[0]
        turn, last = where.get(conversation, (0, _region(shape.seed, conversation, shape.regions)))
        region = _moved(
            shape.seed, conversation, turn, last, shape.regions, params.move_probability
        )
        moves += region != last
        where[conversation] = (turn + 1, region)
        contents.append(
            RequestContent(
                region,
                tuple(tokens[:prompt_length]),
                min(output_length, params.max_output_tokens),
                conversation,
            )
        )
    derived = {
        "window_start": start,
        "trace_rows": len(rows),
        "trace_span_s": span / 1000.0,
        "time_scale": (n / shape.rate_rps) / (span / 1000.0) if span > 0 else None,
        "prompts_cut": cut_prompts,
        "outputs_capped": cut_outputs,
    }
    if params.move_probability > 0:
        derived["moves"] = moves
    return Trace(assemble("w7", arrivals, shape.rate_rps, contents), derived)
