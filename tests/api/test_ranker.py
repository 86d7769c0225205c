"""The gateway's document ranker on the real all-MiniLM-L6-v2 (packaged, CPU, offline):
it finds the one document that answers each question of the RAG workload among four
look-alikes, and its cache (keyed by text) gives each document its own score."""

from __future__ import annotations

from firstlight.api.ranker import EmbeddingRanker
from firstlight.config.sections import DEFAULT_EMBEDDING_PACKAGE, packaged_model_dir
from firstlight_bench.tools.rag_workload import rag_cases


async def test_the_document_holding_the_answer_ranks_first() -> None:
    ranker = EmbeddingRanker(packaged_model_dir(DEFAULT_EMBEDDING_PACKAGE))
    ranker.warm()
    cases = rag_cases(seed=7, questions=40)
    right = 0
    for case in cases:
        scores = await ranker.scores(case.question, case.documents)
        right += max(range(len(scores)), key=scores.__getitem__) == case.relevant
    assert right >= 0.95 * len(cases)
    # From the cache now, in another order: each document keeps its own score.
    first = await ranker.scores(cases[0].question, cases[0].documents)
    backwards = await ranker.scores(cases[0].question, cases[0].documents[::-1])
    assert backwards == first[::-1]
    assert len(set(first)) == len(first)
