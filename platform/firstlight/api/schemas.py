"""OpenAI-compatible request bodies: the subset the gateway serves itself.

Requests are validated here (pydantic) by the gateway's request preparation before
anything else happens; every failure becomes a 400 naming the field (``param``). A body
with any field outside this subset never reaches these models whole: vLLM's own OpenAI
layer serves it, and only its routed view (:func:`firstlight.api.extended.routed_view`)
is validated here; so no field is ever silently dropped. Responses are plain dicts
built by :mod:`firstlight.api.responses`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "EmbeddingsRequest",
    "StreamOptions",
    "TextPart",
    "invalid_unicode_at",
]

MAX_STOP_SEQUENCES = 4


def invalid_unicode_at(document: object) -> str | None:
    """The JSON path (``messages.0.content``) of the first string or object key in a
    parsed request body that is not valid Unicode, or ``None`` when every one is.

    JSON may carry lone surrogates (``"\\ud800"``); Python's ``json`` decodes them into
    strings that UTF-8, tokenizers and engines all refuse, each with its own exception.
    The gateway calls this on the parsed body before anything else reads it, so such a
    request is a 400 naming the field whatever engine serves the model. Iterative, so a
    deeply nested body cannot exhaust the stack.
    """
    stack: list[tuple[str, object]] = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not _is_unicode(value):
                return path or "body"
        elif isinstance(value, dict):
            items: list[tuple[str, object]] = []
            for key, item in value.items():
                where = f"{path}.{key}" if path else str(key)
                if not _is_unicode(str(key)):
                    return path or "body"
                items.append((where, item))
            stack.extend(reversed(items))
        elif isinstance(value, list):
            for index in range(len(value) - 1, -1, -1):
                stack.append((f"{path}.{index}" if path else str(index), value[index]))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TextPart(_Body):
    """One part of a message's content; only text parts are served."""

    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    """One chat message."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Body):
    """``stream_options``: whether the last streamed chunk carries usage."""

    include_usage: bool = False


class _Sampling(_Body):
    model: Annotated[str, Field(min_length=1, max_length=256)]
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        return tuple(s for s in stops if s)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int | None, Field(ge=1)] = None
    max_completion_tokens: Annotated[int | None, Field(ge=1)] = None

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the current name) or ``max_tokens`` (legacy)."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: a text prompt or a list of token ids."""

    prompt: str | Annotated[list[int], Field(min_length=1)]
    max_tokens: Annotated[int | None, Field(ge=1)] = 16

    @model_validator(mode="after")
    def _prompt_not_empty(self) -> CompletionRequest:
        if isinstance(self.prompt, str) and not self.prompt:
            raise ValueError("prompt must not be empty")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


MAX_EMBEDDING_INPUTS = 2048
"""Most inputs in one embeddings request (OpenAI's own bound)."""


class EmbeddingsRequest(BaseModel):
    """``POST /v1/embeddings``: what the gateway parses to route it (the model and the
    inputs). Every other field goes to vLLM's OpenAI layer with the body, which refuses a
    field it does not define by name (:mod:`firstlight.engine.vllm_openai`)."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: (
        Annotated[str, Field(min_length=1)]
        | list[Annotated[str, Field(min_length=1)]]
        | list[Annotated[int, Field(ge=0)]]
        | list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]]
    )
    """One text, several texts, one list of token ids or several (OpenAI's forms)."""

    @field_validator("input", mode="before")
    @classmethod
    def _some_inputs(cls, value: object) -> object:
        if isinstance(value, list) and not value:
            raise ValueError("at least 1 input is needed")
        if isinstance(value, list) and len(value) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"{len(value)} inputs; at most {MAX_EMBEDDING_INPUTS} are accepted")
        return value

    def inputs(self) -> list[str | list[int]]:
        """Each input on its own: a text or a list of token ids."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [list(self.input)]
        return list(self.input)  # type: ignore[arg-type]
