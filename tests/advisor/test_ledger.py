"""The prefix-cache advisor's ledger: each cause of recomputed prompt tokens is found
where it was planted, priced at the replica's prefill rate, and nowhere else."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from firstlight.advisor import PrefixAdvisor, PromptSample
from firstlight.prefix import HashScheme, hint_hashes

BLOCK = 16
SCHEME = HashScheme(block_size=BLOCK, seed=0)
MS_PER_TOKEN = 0.5
rng = random.Random(11)


def _tokens(n: int) -> list[int]:
    return [rng.randrange(49_152) for _ in range(n)]


def _sample(
    ids: Sequence[int],
    *,
    cached: int = 0,
    held: int | None = 0,
    group: str = "acme",
    model: str = "m",
    ms: float | None = MS_PER_TOKEN,
    ttft: float | None = None,
) -> PromptSample:
    return PromptSample(
        group=group,
        model=model,
        token_ids=tuple(ids),
        block_hashes=hint_hashes(ids, SCHEME),
        block_size=BLOCK,
        prompt_tokens=len(ids),
        cached_tokens=cached,
        held_tokens=held,
        ms_per_token=ms,
        ttft_ms=ttft,
    )


def _full_blocks(n: int) -> int:
    return n // BLOCK * BLOCK


def test_a_variable_first_line_before_a_static_prompt_is_found_and_priced() -> None:
    advisor = PrefixAdvisor(1.0)
    static = _tokens(600)
    for _ in range(20):
        advisor.observe(_sample(_tokens(12) + static))  # nothing leading is shared: no hits

    (row,) = advisor.report()
    assert (row.group, row.model, row.requests, row.cached_tokens) == ("acme", "m", 20, 0)
    (finding,) = row.findings
    assert finding.kind == "variable_prefix"
    assert finding.requests == 19  # every request after the first
    # The static run, less the chunk cut before its first content-defined cut.
    assert 19 / 20 * 500 <= finding.tokens_per_request <= 19 / 20 * 600
    assert finding.saving_ms_per_request == pytest.approx(
        finding.tokens_per_request * MS_PER_TOKEN, abs=0.05
    )
    assert finding.diverge_at_token == 0
    assert finding.agree_from_token is not None
    assert 12 <= finding.agree_from_token <= 12 + 100
    assert row.prefill_ms_per_100_tokens == 100 * MS_PER_TOKEN
    assert row.price_source == "cost_model"


def test_static_first_prompts_served_from_cache_have_nothing_to_fix() -> None:
    advisor = PrefixAdvisor(1.0)
    static = _tokens(600)
    for i in range(20):
        hit = _full_blocks(600) if i else 0
        advisor.observe(_sample(static + _tokens(12), cached=hit, held=hit))

    (row,) = advisor.report()
    assert row.findings == ()
    assert row.cached_share == pytest.approx(19 * _full_blocks(600) / (20 * 612), abs=1e-4)
    assert row.shared_prefix_tokens_p50 == _full_blocks(600)


@pytest.mark.parametrize(
    ("held", "kind"),
    [(0, "evicted"), (_full_blocks(300), "held_elsewhere"), (None, "not_reused")],
)
def test_a_repeated_prompt_computed_again_is_explained(held: int | None, kind: str) -> None:
    advisor = PrefixAdvisor(1.0)
    prompt = _tokens(300)
    for _ in range(4):
        advisor.observe(_sample(prompt, cached=0, held=held))

    (row,) = advisor.report()
    (finding,) = row.findings
    assert finding.kind == kind
    assert finding.requests == 3
    assert finding.tokens_per_request == pytest.approx(3 / 4 * _full_blocks(300))
    assert finding.diverge_at_token is None


def test_causes_below_the_minimum_share_are_not_reported() -> None:
    advisor = PrefixAdvisor(1.0, min_share=0.5)
    prompt = _tokens(300)
    advisor.observe(_sample(prompt))
    advisor.observe(_sample(prompt, cached=_full_blocks(300), held=_full_blocks(300)))
    advisor.observe(_sample(prompt, cached=_full_blocks(300) - BLOCK, held=_full_blocks(300)))
    (row,) = advisor.report()
    assert row.findings == ()  # 16 of 900 tokens held elsewhere: under half


def test_tokens_are_priced_at_the_default_rate_until_a_replica_rate_is_seen() -> None:
    advisor = PrefixAdvisor(2.0)
    prompt = _tokens(100)
    advisor.observe(_sample(prompt, ms=None))
    advisor.observe(_sample(prompt, ms=None))
    (row,) = advisor.report()
    assert (row.price_source, row.cost_model_ms_per_100_tokens) == ("default", None)
    assert row.prefill_ms_per_100_tokens == 200.0
    assert row.findings[0].saving_ms_per_request == pytest.approx(
        row.findings[0].tokens_per_request * 2.0
    )


def test_groups_and_models_are_separate_rows_and_bounded() -> None:
    advisor = PrefixAdvisor(1.0, max_groups=3)
    prompt = _tokens(64)
    advisor.observe(_sample(prompt, group="acme", model="other"))
    for group in ("acme", "globex", "initech", "umbrella"):
        advisor.observe(_sample(prompt, group=group))
    advisor.observe(_sample(prompt, group="acme"))
    rows = {(r.group, r.model): r.requests for r in advisor.report()}
    # Rows beyond the bound are counted under "(other)"; known rows keep counting.
    assert rows == {("acme", "other"): 1, ("acme", "m"): 2, ("globex", "m"): 1, ("(other)", "m"): 2}


def test_a_group_sees_blocks_another_group_sent_but_not_its_chunks() -> None:
    advisor = PrefixAdvisor(1.0)
    static = _tokens(400)
    advisor.observe(_sample(_tokens(9) + static, group="acme"))
    advisor.observe(_sample(_tokens(9) + static, group="globex"))
    rows = {r.group: r for r in advisor.report()}
    assert rows["globex"].findings == ()  # another tenant's content teaches it nothing


def test_memory_is_bounded_least_recently_used_first() -> None:
    advisor = PrefixAdvisor(1.0, block_memory=8, chunk_memory=4)
    first = _tokens(8 * BLOCK)
    advisor.observe(_sample(first))
    for _ in range(3):
        advisor.observe(_sample(_tokens(8 * BLOCK)))  # pushes every block of `first` out
    advisor.observe(_sample(first))
    (row,) = advisor.report()
    assert row.findings == ()  # forgotten: neither its blocks nor its chunks count as seen
    assert row.shared_prefix_tokens_p50 == 0


def test_a_non_positive_default_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="default_ms_per_token"):
        PrefixAdvisor(0.0)


def test_the_price_is_the_measured_slope_of_ttft_over_uncached_tokens() -> None:
    advisor = PrefixAdvisor(1.0)
    static = _tokens(600)
    noise = random.Random(5)
    for i in range(30):  # hits and misses: 2.7 ms per computed token, 40 ms fixed, noise
        miss = i % 2 == 0
        cached = 0 if miss or i == 1 else _full_blocks(600)
        ids = _tokens(12) + static if miss else static + _tokens(12)
        uncached = len(ids) - cached
        ttft = 40.0 + 2.7 * uncached + noise.uniform(-30, 30)
        advisor.observe(_sample(ids, cached=cached, held=cached, ttft=ttft))

    (row,) = advisor.report()
    assert row.price_source == "measured"
    assert row.cost_model_ms_per_100_tokens == 100 * MS_PER_TOKEN  # reported beside it
    assert row.prefill_ms_per_100_tokens == pytest.approx(270.0, rel=0.05)
    price, samples = advisor.price("m")
    assert samples == 30
    assert price == pytest.approx(2.7, rel=0.05)
    variable = next(f for f in row.findings if f.kind == "variable_prefix")
    assert variable.saving_ms_per_request == pytest.approx(
        variable.tokens_per_request * row.prefill_ms_per_100_tokens / 100, rel=0.01
    )


def test_without_spread_in_uncached_tokens_the_cost_models_rate_is_used() -> None:
    advisor = PrefixAdvisor(1.0)
    for _ in range(20):  # every request the same size: a slope means nothing
        advisor.observe(_sample(_tokens(300), ttft=500.0))
    (row,) = advisor.report()
    assert row.price_source == "cost_model"
    assert advisor.price("m") == (None, 20)
    assert row.prefill_ms_per_100_tokens == 100 * MS_PER_TOKEN
