"""Dynamic context loading: a RAG client sends its retrieved documents beside the
conversation, and the gateway keeps the most relevant ones within a token budget.

The client passes ``{"firstlight": {"documents": [...], "context_budget_tokens": N}}``
with a chat completion (``extra_body`` in OpenAI's client). The gateway ranks the
documents against the last user message (:class:`Ranker`, a small local embedding model),
keeps the best ones whose tokens fit the budget (always the best one), and writes them
into the conversation **static parts first**: the system prompt, then the kept documents,
then the conversation — so the system prompt's cached blocks are reused by every request
and only the documents and the question are prefilled. Without a budget every document
is kept, in the client's order.

:class:`ContextLoader` is built once per gateway and called by
:class:`~firstlight.api.gateway.GatewayCore` before request preparation, on the event loop
(the ranker runs in a worker thread); it returns a rewritten body, so the rest of the
request path — both serving paths, peers — sees an ordinary chat request.
:func:`choose_documents` and :func:`with_documents` are pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from firstlight.api.prompts import PromptEncoder
from firstlight.config import DynamicContextSettings, ModelConfig
from firstlight.errors import BadRequestError

__all__ = [
    "EXTENSION_FIELD",
    "ContextChoice",
    "ContextLoader",
    "Ranker",
    "choose_documents",
    "with_documents",
]

EXTENSION_FIELD = "firstlight"
"""The request field of Firstlight's extensions (``extra_body={"firstlight": ...}``)."""
MAX_DOCUMENTS = 64


class _Extension(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, max_length=MAX_DOCUMENTS
    )
    context_budget_tokens: int | None = Field(default=None, ge=1, le=1_048_576)


class Ranker(Protocol):
    """Scores documents against a query (higher: more relevant)."""

    async def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """One score per document, in order; called once per request with documents."""
        ...


@dataclass(frozen=True, slots=True)
class ContextChoice:
    """Which documents a request kept (indices into the client's list, in that order)."""

    kept: tuple[int, ...]
    offered: int
    kept_tokens: int
    offered_tokens: int

    def header(self) -> str:
        """The ``x-firstlight-context`` response header."""
        return (
            f"kept {len(self.kept)} of {self.offered} documents "
            f"({self.kept_tokens} of {self.offered_tokens} tokens): "
            + ",".join(str(i) for i in self.kept)
        )


def choose_documents(
    scores: Sequence[float], tokens: Sequence[int], budget_tokens: int | None
) -> ContextChoice:
    """The documents to keep: the best-scored ones whose tokens fit ``budget_tokens``
    (always the best one, even alone over the budget), in the client's order; every one
    without a budget."""
    offered = sum(tokens)
    if budget_tokens is None:
        kept = tuple(range(len(tokens)))
    else:
        ranked = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
        chosen = [ranked[0]]
        used = tokens[ranked[0]]
        for i in ranked[1:]:
            if used + tokens[i] <= budget_tokens:
                chosen.append(i)
                used += tokens[i]
        kept = tuple(sorted(chosen))
    return ContextChoice(kept, len(tokens), sum(tokens[i] for i in kept), offered)


def with_documents(messages: list[Any], documents: Sequence[str]) -> list[Any]:
    """``messages`` with ``documents`` written after the system prompt (static first):
    appended to a leading system/developer message with text content, else in a system
    message of their own at the start."""
    block = "Documents:\n\n" + "\n\n".join(f"[{i}] {d}" for i, d in enumerate(documents, 1))
    first = messages[0] if messages else None
    if (
        isinstance(first, dict)
        and first.get("role") in ("system", "developer")
        and isinstance(first.get("content"), str)
    ):
        return [{**first, "content": f"{first['content']}\n\n{block}"}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def _query(messages: list[Any]) -> str:
    """The last user message's text: what the documents are ranked against."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


class ContextLoader:
    """Applies dynamic context loading to the chat requests of one gateway."""

    def __init__(
        self,
        models: Sequence[ModelConfig],
        encoders: Mapping[str, PromptEncoder],
        ranker: Ranker | None,
    ) -> None:
        self._models = {m.name: m for m in models}
        self._encoders = encoders
        self._ranker = ranker

    async def apply(
        self, body: bytes, by_key: DynamicContextSettings | None = None
    ) -> tuple[bytes, ContextChoice | None]:
        """``body`` with its documents chosen and written into its messages, and the
        choice; ``body`` itself and ``None`` when it carries no ``firstlight`` field.
        ``by_key`` is the caller's key's opt-in (:attr:`Caller.dynamic_context
        <firstlight.api.auth.Caller.dynamic_context>`), which allows any chat model and
        whose default budget wins over the model's. Raises
        :class:`~firstlight.errors.BadRequestError` naming the field."""
        if EXTENSION_FIELD.encode() not in body:
            return body, None
        try:
            data = json.loads(body)
        except ValueError:
            return body, None  # the preparer names the problem
        if not isinstance(data, dict) or EXTENSION_FIELD not in data:
            return body, None
        extension = self._extension(data.pop(EXTENSION_FIELD))
        model = self._models.get(str(data.get("model")))
        if model is None:
            return body, None  # the preparer refuses the model by name
        settings = model.dynamic_context
        if settings is None or (by_key is not None and by_key.default_budget_tokens):
            settings = by_key
        if settings is None or self._ranker is None:
            raise BadRequestError(
                f"{EXTENSION_FIELD}.documents: model {model.name!r} does not load context "
                "dynamically (models[].dynamic_context) and this API key is not opted in "
                "(auth.api_keys[].dynamic_context)",
                param=f"{EXTENSION_FIELD}.documents",
            )
        messages = data.get("messages")
        if not isinstance(messages, list):
            return body, None  # the preparer names the problem
        documents = extension.documents
        budget = extension.context_budget_tokens or settings.default_budget_tokens
        encoder = self._encoders[model.name]
        tokens = [len(encoder.text(d)) for d in documents]
        scores = (
            await self._ranker.scores(_query(messages), documents)
            if budget is not None
            else [0.0] * len(documents)
        )
        choice = choose_documents(scores, tokens, budget)
        data["messages"] = with_documents(messages, [documents[i] for i in choice.kept])
        return json.dumps(data).encode(), choice

    @staticmethod
    def _extension(value: object) -> _Extension:
        try:
            return _Extension.model_validate(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in (EXTENSION_FIELD, *err["loc"]))
            raise BadRequestError(f"{where}: {err['msg']}", param=where) from exc
