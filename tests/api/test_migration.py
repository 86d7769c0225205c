"""Resuming a request after its replica failed: the continuation request, its routing
view, the usage the client sees and the attempt budget (pure code)."""

from __future__ import annotations

from firstlight.api.migration import Attempts, continuation, merged_usage
from firstlight.engine.protocol import GenerationRequest, SamplingSettings, Usage
from firstlight.prefix import HashScheme, hint_hashes

SCHEME = HashScheme(block_size=32, seed=0)


def test_continuation_appends_the_sent_tokens_and_shrinks_max_tokens() -> None:
    original = GenerationRequest(
        "chatcmpl-1",
        tuple(range(50)),
        SamplingSettings(max_tokens=40, temperature=0.0, stop=("END",)),
        cache_salt="tenant-a",
    )
    request, routing = continuation(original, list(range(900, 920)), SCHEME)
    assert request.prompt_token_ids == tuple(range(50)) + tuple(range(900, 920))
    assert request.sampling.max_tokens == 20
    assert request.sampling.stop == ("END",)
    assert (request.request_id, request.cache_salt, request.resumed_tokens) == (
        "chatcmpl-1",
        "tenant-a",
        20,
    )
    # 70 tokens: two full blocks, hashed with the tenant's salt, as the engine will.
    assert routing.block_hashes == hint_hashes(
        request.prompt_token_ids, SCHEME, cache_salt="tenant-a"
    )
    assert len(routing.block_hashes) == 2
    assert routing.prompt_tokens == 70


def test_a_second_resume_counts_from_the_original_request() -> None:
    original = GenerationRequest("c", (1, 2, 3), SamplingSettings(max_tokens=10))
    request, _ = continuation(original, [7, 8, 9, 10, 11], SCHEME)
    assert (request.resumed_tokens, request.sampling.max_tokens) == (5, 5)
    assert request.prompt_token_ids == (1, 2, 3, 7, 8, 9, 10, 11)


def test_merged_usage_reports_the_original_prompt_and_every_token_sent() -> None:
    last = Usage(prompt_tokens=70, completion_tokens=20, cached_prompt_tokens=64)
    assert merged_usage(last, 50, 40) == Usage(50, 40, 50)
    assert merged_usage(Usage(70, 20, 32), 50, 40) == Usage(50, 40, 32)
    assert merged_usage(None, 50, 40) is None


def test_attempts_are_bounded_and_explain_themselves() -> None:
    attempts = Attempts(limit=3)
    assert attempts.another("replica a died")
    assert attempts.another("replica b died")
    assert not attempts.another("replica c died")
    assert attempts.used == 3
    assert attempts.summary() == (
        "3 attempt(s) failed: replica a died; replica b died; replica c died"
    )
    assert not Attempts(limit=1).another("only one allowed")
