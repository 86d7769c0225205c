"""Dynamic context loading (``firstlight.api.context``): which documents are kept, where
they are written, and the refusals that name their field. The ranker is a fake scoring
by a keyword (the real one is checked in ``tests/api/test_ranker.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from firstlight.api.context import ContextChoice, ContextLoader, choose_documents, with_documents
from firstlight.api.prompts import SimPromptEncoder
from firstlight.config import DynamicContextSettings, parse_config
from firstlight.errors import BadRequestError


@pytest.mark.parametrize(
    ("scores", "tokens", "budget", "kept"),
    [
        ([0.1, 0.9, 0.5], [100, 100, 100], None, (0, 1, 2)),  # no budget: every one
        ([0.1, 0.9, 0.5], [100, 100, 100], 150, (1,)),  # the best that fits
        ([0.1, 0.9, 0.5], [100, 100, 100], 200, (1, 2)),  # in the client's order
        ([0.1, 0.9, 0.5], [100, 500, 100], 150, (1,)),  # the best one even over budget
        ([0.9, 0.8, 0.7], [100, 300, 100], 250, (0, 2)),  # skips one that does not fit
        ([0.5, 0.5], [10, 10], 10, (0,)),  # ties: the earlier one
    ],
)
def test_choose_documents(
    scores: list[float], tokens: list[int], budget: int | None, kept: tuple[int, ...]
) -> None:
    choice = choose_documents(scores, tokens, budget)
    assert choice.kept == kept
    assert choice.kept_tokens == sum(tokens[i] for i in kept)
    assert (choice.offered, choice.offered_tokens) == (len(tokens), sum(tokens))


def test_documents_go_after_the_system_prompt_and_before_the_conversation() -> None:
    system = {"role": "system", "content": "Be brief."}
    user = {"role": "user", "content": "Where?"}
    [first, second] = with_documents([system, user], ["alpha", "beta"])
    assert first == {
        "role": "system",
        "content": "Be brief.\n\nDocuments:\n\n[1] alpha\n\n[2] beta",
    }
    assert second == user
    # No system prompt: the documents get a system message of their own, first.
    assert with_documents([user], ["alpha"]) == [
        {"role": "system", "content": "Documents:\n\n[1] alpha"},
        user,
    ]


class KeywordRanker:
    """Scores a document 1 when it contains the query's last word, else 0."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        self.queries.append(query)
        word = query.rstrip("?").split()[-1]
        return [1.0 if word in d else 0.0 for d in documents]


CONFIG = parse_config(
    {
        "models": [
            {"name": "rag", "engine": "sim", "dynamic_context": {"default_budget_tokens": 5}},
            {"name": "plain", "engine": "sim"},
        ]
    },
    "test",
)
DOCUMENTS = ["one two three about oslo", "one two three about lima", "one two three about rome"]


def _loader(ranker: KeywordRanker) -> ContextLoader:
    return ContextLoader(CONFIG.models, {m.name: SimPromptEncoder() for m in CONFIG.models}, ranker)


def _body(model: str = "rag", **extension: Any) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Tell me about lima"},
            ],
            "max_tokens": 4,
            "firstlight": extension,
        }
    ).encode()


async def test_the_relevant_documents_are_written_into_the_body() -> None:
    ranker = KeywordRanker()
    body, choice = await _loader(ranker).apply(_body(documents=DOCUMENTS, context_budget_tokens=6))
    assert choice == ContextChoice((1,), 3, choice.kept_tokens, choice.offered_tokens)
    assert choice.header().startswith("kept 1 of 3 documents")
    assert choice.header().endswith(": 1")
    data = json.loads(body)
    assert "firstlight" not in data
    assert data["max_tokens"] == 4
    assert data["messages"][0]["content"].endswith("[1] one two three about lima")
    assert "oslo" not in data["messages"][0]["content"]
    assert data["messages"][1] == {"role": "user", "content": "Tell me about lima"}
    assert ranker.queries == ["Tell me about lima"]


async def test_the_models_default_budget_applies_and_no_budget_keeps_every_one() -> None:
    ranker = KeywordRanker()
    _, by_default = await _loader(ranker).apply(_body(documents=DOCUMENTS))
    assert by_default is not None
    assert by_default.kept == (1,)
    config = parse_config(
        {"models": [{"name": "rag", "engine": "sim", "dynamic_context": {}}]}, "t"
    )
    loader = ContextLoader(config.models, {"rag": SimPromptEncoder()}, ranker)
    body, everything = await loader.apply(_body(documents=DOCUMENTS))
    assert everything is not None
    assert everything.kept == (0, 1, 2)
    assert len(ranker.queries) == 1  # nothing to rank without a budget
    assert all(d in json.loads(body)["messages"][0]["content"] for d in DOCUMENTS)


async def test_a_key_opted_in_loads_context_on_any_model_with_its_own_budget() -> None:
    ranker = KeywordRanker()
    by_key = DynamicContextSettings(default_budget_tokens=6)
    body, choice = await _loader(ranker).apply(_body("plain", documents=DOCUMENTS), by_key)
    assert choice is not None
    assert choice.kept == (1,)  # the key's budget: one document on a model not opted in
    assert "lima" in json.loads(body)["messages"][0]["content"]
    _, wide = await _loader(ranker).apply(
        _body(documents=DOCUMENTS), DynamicContextSettings(default_budget_tokens=1000)
    )
    assert wide is not None
    assert wide.kept == (0, 1, 2)  # the key's budget wins over the model's (5 tokens)
    _, model_budget = await _loader(ranker).apply(
        _body(documents=DOCUMENTS), DynamicContextSettings()
    )
    assert model_budget is not None
    assert model_budget.kept == (1,)  # a key without a budget leaves the model's


async def test_a_body_without_documents_is_left_alone() -> None:
    plain = json.dumps({"model": "plain", "messages": []}).encode()
    assert await _loader(KeywordRanker()).apply(plain) == (plain, None)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_body("plain", documents=DOCUMENTS), "firstlight.documents"),
        (_body(documents=[]), "firstlight.documents"),
        (_body(documents=[""]), "firstlight.documents.0"),
        (_body(documents=DOCUMENTS, context_budget_tokens=0), "firstlight.context_budget_tokens"),
        (_body(documents=DOCUMENTS, budget=5), "firstlight.budget"),
    ],
)
async def test_refusals_name_the_field(body: bytes, param: str) -> None:
    with pytest.raises(BadRequestError) as caught:
        await _loader(KeywordRanker()).apply(body)
    assert caught.value.param == param
