"""Turning a request body into what the region serves: validation, bounds, tokens, hashes.

:class:`RequestPreparer` is built once per gateway (:class:`~firstlight.api.gateway.GatewayCore`)
and called once per request, on the event loop, before the region decision: invalid JSON,
text that is not valid Unicode, a schema error, an unknown model, too many messages,
token ids outside the vocabulary and prompts or outputs over the bounds are refused here
with an OpenAI-shaped 400 (404 for the model) that names the field. Nothing it refuses
reaches a tokenizer or an engine. A request with fields beyond the gateway's own subset
(:mod:`firstlight.api.extended`) is prepared for vLLM's OpenAI layer on the replica
(``Prepared.openai``), or refused naming the field when its model is simulated. A
``model`` that names one of a model's LoRA adapters is prepared for that model's replicas,
with the adapter in its block hashes as vLLM keys its cache blocks.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from firstlight.api.extended import NATIVE_FIELDS, extended_fields, routed_view
from firstlight.api.in_region import Prepared
from firstlight.api.prompts import PromptEncoder
from firstlight.api.responses import Kind
from firstlight.api.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingsRequest,
    invalid_unicode_at,
)
from firstlight.config import ModelConfig, PlatformConfig
from firstlight.engine.protocol import GenerationRequest, OpenAICall, SamplingSettings
from firstlight.errors import BadRequestError, ModelNotServedError
from firstlight.prefix import HashScheme, LoraKey, hint_hashes
from firstlight.routing import RequestView

__all__ = ["OFF_LOOP_BODY_BYTES", "RequestPreparer"]

OFF_LOOP_BODY_BYTES = 16 * 1024
"""Bodies at least this long are prepared on the gateway's tokenizer thread, off the
event loop (:meth:`RequestPreparer.prepare_off_loop`): a long prompt's chat template and
tokenizing take milliseconds, which would hold up every other stream of the gateway.
Shorter ones are prepared inline, where the hop to a thread would cost more than it
frees."""


class RequestPreparer:
    """Validates and encodes requests for the models of one gateway."""

    def __init__(
        self,
        config: PlatformConfig,
        encoders: Mapping[str, PromptEncoder],
        schemes: Mapping[str, HashScheme],
    ) -> None:
        self.config = config
        self.encoders = encoders
        self._schemes = schemes
        self._pool: ThreadPoolExecutor | None = None
        self._models: dict[str, tuple[ModelConfig, LoraKey | None]] = {}
        for m in config.models:
            self._models[m.name] = (m, None)
            self._models.update({a.name: (m, LoraKey(a.name, a.path)) for a in m.lora_adapters})

    async def prepare_off_loop(
        self, kind: Kind, body: bytes, cache_salt: str | None = None
    ) -> Prepared:
        """:meth:`prepare`, on one worker thread for a body of
        :data:`OFF_LOOP_BODY_BYTES` or more (one thread: a tokenizer is not used by two
        long preparations at once, and the queue is bounded by the gateway's in-flight
        limit), inline for a shorter one. Called by the gateway once per request;
        raises what :meth:`prepare` raises."""
        if len(body) < OFF_LOOP_BODY_BYTES:
            return self.prepare(kind, body, cache_salt)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.prepare, kind, body, cache_salt)

    def prepare(self, kind: Kind, body: bytes, cache_salt: str | None = None) -> Prepared:
        """The request in ``body`` validated, tokenized and hashed. Raises
        :class:`~firstlight.errors.BadRequestError` (400, naming the field) or
        :class:`~firstlight.errors.ModelNotServedError` (404)."""
        try:
            raw = json.loads(body)
        except ValueError as exc:
            raise BadRequestError(f"the body is not valid JSON: {exc}") from exc
        except RecursionError as exc:  # json's recursive parser on deeply nested input
            raise BadRequestError("the body's JSON nests too deeply") from exc
        invalid = invalid_unicode_at(raw)
        if invalid is not None:
            raise BadRequestError(
                f"{invalid}: the text is not valid Unicode (a lone surrogate such as "
                "\\ud800 has no UTF-8 encoding)",
                param=invalid,
            )
        if kind == "embeddings":
            return self._embeddings(raw, body, cache_salt)
        extended = extended_fields(kind, raw) if isinstance(raw, dict) else ()
        schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
        try:
            parsed: ChatCompletionRequest | CompletionRequest = schema.model_validate(
                routed_view(kind, raw) if extended else raw
            )
        except ValidationError as exc:
            raise _schema_error(exc) from exc
        served = self._served(parsed.model)
        model, lora = served
        if model.task == "embed":
            raise BadRequestError(
                f"{model.name!r} is an embedding model: it serves /v1/embeddings", param="model"
            )
        if extended and model.engine == "sim":
            raise BadRequestError(
                f"{extended[0]}: the simulated model {model.name!r} serves only the "
                f"gateway's own fields ({', '.join(sorted(NATIVE_FIELDS[kind]))}); "
                "see docs/api.md",
                param=extended[0],
            )
        limits = self.config.gateway
        encoder = self.encoders[model.name]
        if isinstance(parsed, ChatCompletionRequest):
            if len(parsed.messages) > limits.max_messages:
                raise BadRequestError(
                    f"{len(parsed.messages)} messages; at most {limits.max_messages} are "
                    "accepted (gateway.max_messages)",
                    param="messages",
                )
            tools = raw.get("tools") if extended else None
            prompt = encoder.chat(parsed.messages, tools if isinstance(tools, list) else None)
        elif isinstance(parsed.prompt, str):
            prompt = encoder.text(parsed.prompt)
        else:
            prompt = tuple(parsed.prompt)
            _check_vocabulary(prompt, encoder, "prompt")
        if limits.max_prompt_tokens is not None and len(prompt) > limits.max_prompt_tokens:
            raise BadRequestError(
                f"the prompt has {len(prompt)} tokens; at most {limits.max_prompt_tokens} are "
                "accepted (gateway.max_prompt_tokens)",
                param="messages" if kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        room = model.max_model_len - len(prompt)
        if limits.max_output_tokens is not None:
            room = min(room, limits.max_output_tokens)
        max_tokens = parsed.requested_max_tokens
        if (
            limits.max_output_tokens is not None
            and max_tokens is not None
            and max_tokens > limits.max_output_tokens
        ):
            raise BadRequestError(
                f"max_tokens is {max_tokens}; at most {limits.max_output_tokens} are accepted "
                "(gateway.max_output_tokens)",
                param="max_tokens",
            )
        if extended:
            _check_choices(raw, limits.max_choices)
        if room < 1 or (max_tokens is not None and max_tokens > room):
            asked = max_tokens if max_tokens is not None else 1
            raise BadRequestError(
                f"this model's maximum context length is {model.max_model_len} tokens; "
                f"the prompt has {len(prompt)} tokens and {asked} more were requested",
                param="messages" if kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        sampling = SamplingSettings(
            max_tokens=max_tokens if max_tokens is not None else room,
            temperature=parsed.temperature,
            top_p=parsed.top_p,
            seed=parsed.seed,
            stop=parsed.stop_sequences(),
            defaulted=tuple(
                f for f in ("temperature", "top_p") if f not in parsed.model_fields_set
            ),
        )
        scheme = self._schemes[model.name]
        routing = RequestView(
            request_id=request_id,
            prompt_tokens=len(prompt),
            block_hashes=hint_hashes(prompt, scheme, cache_salt=cache_salt, lora=lora),
            block_size=scheme.block_size,
        )
        return Prepared(
            kind,
            model,
            GenerationRequest(request_id, prompt, sampling, cache_salt=cache_salt, lora=lora),
            routing,
            parsed.stream,
            parsed.include_usage,
            OpenAICall(request_id, kind, body, cache_salt) if extended else None,
        )

    def _served(self, name: str) -> tuple[ModelConfig, LoraKey | None]:
        served = self._models.get(name)
        if served is None:
            raise ModelNotServedError(
                f"the model {name!r} does not exist here; served models: {', '.join(self._models)}",
                param="model",
                code="model_not_found",
            )
        return served

    def _embeddings(self, raw: object, body: bytes, cache_salt: str | None) -> Prepared:
        """``POST /v1/embeddings``: the inputs tokenized and bounded for routing; vLLM's
        OpenAI layer on the chosen replica computes the embeddings from the body."""
        try:
            parsed = EmbeddingsRequest.model_validate(raw)
        except ValidationError as exc:
            raise _schema_error(exc) from exc
        model, lora = self._served(parsed.model)
        if model.task != "embed" or lora is not None:
            embedders = [m.name for m in self.config.models if m.task == "embed"]
            raise BadRequestError(
                f"{parsed.model!r} generates text: /v1/embeddings needs a model with "
                f"task: embed (here: {', '.join(embedders) or 'none'})",
                param="model",
            )
        encoder = self.encoders[model.name]
        inputs = [
            _check_vocabulary(tuple(item), encoder, "input")
            if isinstance(item, list)
            else encoder.text(item)
            for item in parsed.inputs()
        ]
        longest = max(len(tokens) for tokens in inputs)
        truncated = isinstance(raw, dict) and raw.get("truncate_prompt_tokens") is not None
        if longest > model.max_model_len and not truncated:
            raise BadRequestError(
                f"an input has {longest} tokens; this model's maximum context length is "
                f"{model.max_model_len} tokens",
                param="input",
                code="context_length_exceeded",
            )
        total = sum(len(tokens) for tokens in inputs)
        limit = self.config.gateway.max_prompt_tokens
        if limit is not None and total > limit:
            raise BadRequestError(
                f"the inputs have {total} tokens; at most {limit} are accepted "
                "(gateway.max_prompt_tokens)",
                param="input",
                code="context_length_exceeded",
            )
        request_id = f"embd-{uuid.uuid4().hex}"
        scheme = self._schemes[model.name]
        return Prepared(
            "embeddings",
            model,
            GenerationRequest(request_id, (), SamplingSettings(max_tokens=1)),
            # Embedding models keep no prefix cache worth routing on: load only.
            RequestView(request_id, total, (), scheme.block_size),
            stream=False,
            include_usage=False,
            openai=OpenAICall(request_id, "embeddings", body, cache_salt),
        )


def _check_vocabulary(ids: tuple[int, ...], encoder: PromptEncoder, field: str) -> tuple[int, ...]:
    """``ids``, or a 400 naming ``field`` when one is outside the model's vocabulary."""
    outside = next((t for t in ids if not 0 <= t < encoder.vocabulary), None)
    if outside is not None:
        raise BadRequestError(
            f"{field}: token id {outside} is outside the model's vocabulary "
            f"(0 to {encoder.vocabulary - 1})",
            param=field,
        )
    return ids


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none"})


def _schema_error(exc: ValidationError) -> BadRequestError:
    """The 400 for a body its schema refused: the first problem, naming its field."""
    err = exc.errors()[0]
    param = _param(err["loc"])
    return BadRequestError(f"{param}: {err['msg']}" if param else err["msg"], param=param)


def _param(loc: tuple[int | str, ...]) -> str | None:
    """The request field a validation error is about (``messages.0.content``), without
    the union member pydantic tried (``str``, ``list[int]``); ``None`` for the body."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and _is_union_tag(p))]
    return ".".join(parts) or None


def _is_union_tag(part: str) -> bool:
    return part in _UNION_TAGS or "[" in part or part.startswith("constrained-")


def _check_choices(body: dict[str, Any], most: int) -> None:
    """Refuse ``n`` or ``best_of`` above ``gateway.max_choices`` (what is not an integer
    is left to vLLM's own validation, which names it)."""
    for name in ("n", "best_of"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > most:
            raise BadRequestError(
                f"{name} is {value}; at most {most} choices are accepted per request "
                "(gateway.max_choices)",
                param=name,
            )
