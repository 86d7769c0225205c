"""vLLM's own OpenAI layer on top of a replica's engine: every request field vLLM's
OpenAI server accepts works the same here.

Built once per vLLM replica by :class:`~firstlight.engine.vllm_engine.VllmEngine` (after
its ``AsyncLLM`` starts) and called by the ModelServer once per request that uses a field
outside the gateway's own subset (:mod:`firstlight.api.extended` decides). It wires vLLM's
serving classes as vLLM's server does — ``init_app_state`` with arguments parsed by vLLM's
own parser — like Ray Serve LLM's ``VLLMEngine``.

Two things are added on top:

* a field vLLM's request model does not define is refused (400 naming it); vLLM itself
  ignores such fields with a debug log line, which is silence for the client;
* the first engine output of each request is observed (a thin wrapper around the engine
  client), so a JSON request still reports its time to first token, and streamed usage
  is always taken from vLLM (asked for, and dropped again when the client did not ask).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from firstlight.config import ModelConfig
from firstlight.engine.protocol import OpenAICall, RenderedChunk, Usage
from firstlight.errors import EngineDeadError, EngineError, InvalidRequestError

__all__ = ["VllmOpenAI", "frontend_args", "lora_requests"]

_log = logging.getLogger(__name__)

_DONE = "data: [DONE]\n\n"
_FIRST_OUTPUT: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar(
    "firstlight_first_output", default=None
)


def frontend_args(model: ModelConfig, model_dir: Path) -> list[str]:
    """vLLM server arguments for ``model``'s OpenAI layer (its own parser reads them):
    the served name, cached-token details in usage, the tool-call parser and the LoRA
    adapters. vLLM numbers the adapters 1, 2, ... in this order, as
    :func:`lora_requests` does for the gateway's own path: both paths name the same
    adapter by the same id."""
    args = ["--model", str(model_dir), "--served-model-name", model.name]
    args.append("--enable-prompt-tokens-details")
    if model.lora_adapters:
        args.append("--lora-modules")
        args += [
            json.dumps({"name": a.name, "path": a.path, "base_model_name": model.name})
            for a in model.lora_adapters
        ]
    if model.tool_call_parser is not None:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", model.tool_call_parser]
    return args


def lora_requests(model: ModelConfig) -> dict[str, Any]:
    """vLLM's ``LoRARequest`` of each of ``model``'s adapters, by name, numbered as vLLM's
    OpenAI layer numbers the ``--lora-modules`` of :func:`frontend_args`."""
    from vllm.lora.request import LoRARequest

    return {
        a.name: LoRARequest(lora_name=a.name, lora_int_id=i, lora_path=a.path)
        for i, a in enumerate(model.lora_adapters, start=1)
    }


class _WatchedEngine:
    """The engine client vLLM's serving classes see: the ``AsyncLLM`` itself, except that
    ``generate`` sets the request's first-output event (a context variable set by
    :meth:`VllmOpenAI.serve`, inherited by the tasks vLLM starts)."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        from vllm.sampling_params import RequestOutputKind

        event = _FIRST_OUTPUT.get()
        params: Any = args[1] if len(args) > 1 else kwargs.get("sampling_params")
        final_only = (
            event is not None
            and getattr(params, "output_kind", None) == RequestOutputKind.FINAL_ONLY
            and getattr(params, "n", 1) == 1
        )
        if final_only:
            # A JSON request asks vLLM for the final output only, which would hide the
            # first token. Cumulative outputs end with the same final one; only that
            # one is passed on. (With n > 1 vLLM's cumulative outputs are per choice,
            # so those requests keep FINAL_ONLY and their first token is not seen.)
            params.output_kind = RequestOutputKind.CUMULATIVE
        async for output in self._llm.generate(*args, **kwargs):
            if event is not None and not event.is_set():
                event.set()
            if not final_only or output.finished:
                yield output


class VllmOpenAI:
    """vLLM's chat, completion and embedding serving classes over one engine (those the
    model's task has; the others are ``None``)."""

    def __init__(
        self, chat: Any, completion: Any, embedding: Any, request_models: dict[str, Any]
    ) -> None:
        self._serving = {"chat": chat, "text": completion, "embeddings": embedding}
        self._models = request_models
        self._fields = {kind: _field_names(m) for kind, m in self._models.items()}

    @classmethod
    async def create(cls, llm: Any, model: ModelConfig, model_dir: Path) -> VllmOpenAI:
        """Build the serving classes for ``llm`` (fast: no model load). Raises
        :class:`~firstlight.errors.EngineError` when vLLM refuses the arguments (an
        unknown tool-call parser, say)."""
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        try:
            parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call]
            args = make_arg_parser(parser).parse_args(frontend_args(model, model_dir))
            state = State()
            tasks = await llm.get_supported_tasks()
            engine: Any = _WatchedEngine(llm)
            await init_app_state(engine, state, args, supported_tasks=tasks)
        except (SystemExit, Exception) as exc:
            raise EngineError(
                f"model {model.name!r}: vLLM's OpenAI layer did not start: {exc}"
            ) from exc
        return cls(
            getattr(state, "openai_serving_chat", None),
            getattr(state, "openai_serving_completion", None),
            getattr(state, "serving_embedding", None),
            {
                "chat": ChatCompletionRequest,
                "text": CompletionRequest,
                "embeddings": EmbeddingCompletionRequest,
            },
        )

    async def serve(self, call: OpenAICall) -> AsyncIterator[RenderedChunk]:
        """Serve ``call`` (see :class:`~firstlight.engine.protocol.OpenAIServing`)."""
        request, wants_usage = self._request(call)
        serving = self._serving[call.kind]
        if serving is None:
            raise InvalidRequestError(f"this model does not serve the {_api(call.kind)} API")
        if call.kind == "embeddings":
            yield await self._embeddings(call, serving, request)
            return
        create: Callable[[Any], Any] = (
            serving.create_chat_completion if call.kind == "chat" else serving.create_completion
        )
        first = asyncio.Event()
        token = _FIRST_OUTPUT.set(first)
        try:
            task = asyncio.ensure_future(create(request))
        finally:
            _FIRST_OUTPUT.reset(token)
        try:
            if not request.stream:
                async for chunk in self._whole(call, request, task, first):
                    yield chunk
                return
            result = await _result(task)
            async for chunk in self._events(call, result, wants_usage):
                yield chunk
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    def _request(self, call: OpenAICall) -> tuple[Any, bool]:
        """vLLM's request model of ``call``'s body, with the gateway's request id and
        tenant salt, and whether the client asked for streamed usage (vLLM is always
        asked); raises :class:`InvalidRequestError` naming the field."""
        try:
            data = json.loads(call.body)
        except ValueError as exc:
            raise InvalidRequestError(f"the body is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InvalidRequestError("the body must be a JSON object")
        unknown = sorted(set(data) - self._fields[call.kind])
        if unknown:
            raise InvalidRequestError(
                f"{unknown[0]}: not a field of the {_api(call.kind)} API this model serves "
                "(neither OpenAI's nor vLLM's); see docs/api.md for the supported fields",
                param=unknown[0],
            )
        data["request_id"] = call.request_id.split("-", 1)[-1]
        if call.cache_salt is not None:
            data["cache_salt"] = call.cache_salt
        options = data.get("stream_options")
        wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        if data.get("stream"):
            data["stream_options"] = {**(options if isinstance(options, dict) else {})}
            data["stream_options"]["include_usage"] = True
        try:
            return self._models[call.kind].model_validate(data), wants_usage
        except ValidationError as exc:
            err = exc.errors()[0]
            param = ".".join(str(p) for p in err["loc"] if not isinstance(p, int)) or None
            where = f"{param}: " if param else ""
            raise InvalidRequestError(f"{where}{err['msg']}", param=param) from exc

    async def _embeddings(self, call: OpenAICall, serving: Any, request: Any) -> RenderedChunk:
        """An embeddings request: vLLM's whole JSON answer in one chunk (an embedding
        has no first token: the gateway times the answer itself)."""
        response = await _result(asyncio.ensure_future(serving(request, None)))
        body = bytes(response.body)
        usage = json.loads(body).get("usage") or {}
        return RenderedChunk(call.request_id, body, finished=True, usage=_usage(usage))

    async def _whole(
        self, call: OpenAICall, request: Any, task: asyncio.Future[Any], first: asyncio.Event
    ) -> AsyncIterator[RenderedChunk]:
        """A JSON request: an empty chunk at the first output, then the body. With
        ``n > 1`` vLLM gives no output before the end: the empty chunk comes at once,
        marked untimed, so a long generation is not mistaken for a missing first token
        (the gateway's ``first_token_timeout_s``)."""
        if getattr(request, "n", 1) != 1:
            yield RenderedChunk(call.request_id, b"", timed=False)
        else:
            waiting = asyncio.ensure_future(first.wait())
            try:
                await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
            if first.is_set() and not task.done():
                yield RenderedChunk(call.request_id, b"")
        response = await _result(task)
        usage = _usage(response.usage.model_dump()) if response.usage is not None else None
        body = response.model_dump_json().encode()
        yield RenderedChunk(call.request_id, body, finished=True, usage=usage)

    async def _events(
        self, call: OpenAICall, events: AsyncIterator[str], wants_usage: bool
    ) -> AsyncIterator[RenderedChunk]:
        """A streamed request: vLLM's events as they come; the usage event (the one
        before ``[DONE]``, always asked for) is read, and passed on if the client asked."""
        held: str | None = None
        async for event in events:
            if event == _DONE:
                usage = _event_usage(held)
                tail = (held if held is not None and (wants_usage or usage is None) else "") + event
                yield RenderedChunk(call.request_id, tail.encode(), finished=True, usage=usage)
                return
            if held is not None:
                yield RenderedChunk(call.request_id, held.encode())
            held = event
        if held is not None:  # vLLM always ends with [DONE]; be safe if not
            yield RenderedChunk(call.request_id, held.encode(), finished=True)


async def _result(task: asyncio.Future[Any]) -> Any:
    """What vLLM's ``create_*`` returned; its validation errors (raised, or returned as
    an ``ErrorResponse``) become :class:`InvalidRequestError` naming the field."""
    from vllm.exceptions import VLLMClientError

    try:
        result = await task
    except (VLLMClientError, ValueError) as exc:
        raise InvalidRequestError(str(exc), param=getattr(exc, "parameter", None)) from exc
    return _checked(result)


def _checked(result: Any) -> Any:
    """``result`` unless it is vLLM's ``ErrorResponse``, which becomes our exception."""
    error = getattr(result, "error", None)
    if error is None or not hasattr(error, "code"):
        return result
    message, param, code = str(error.message), error.param, int(error.code or 500)
    if 400 <= code < 500:
        raise InvalidRequestError(message, param=param)
    if "dead" in message.lower():
        raise EngineDeadError(message)
    raise EngineError(message)


def _usage(data: dict[str, Any]) -> Usage:
    details = data.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=int(data.get("prompt_tokens") or 0),
        completion_tokens=int(data.get("completion_tokens") or 0),
        cached_prompt_tokens=int(details.get("cached_tokens") or 0),
    )


def _event_usage(event: str | None) -> Usage | None:
    """The usage of vLLM's last streamed event (``data: {...}``), if it carries one."""
    if event is None or not event.startswith("data: "):
        return None
    try:
        data = json.loads(event[len("data: ") :])
    except ValueError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict) or data.get("choices"):
        return None
    return _usage(usage)


def _field_names(request_model: Any) -> set[str]:
    names: set[str] = set()
    for name, field in request_model.model_fields.items():
        names.add(name)
        if field.alias:
            names.add(field.alias)
    return names


def _api(kind: str) -> str:
    return {"chat": "chat completions", "text": "completions"}.get(kind, kind)
