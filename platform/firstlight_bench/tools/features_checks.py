"""The checks of ``firstlight bench features``: one small async function per request
feature, each sending its requests with the official ``openai`` client (greedy where it
can) and handing the answers to a judge of :mod:`firstlight_bench.tools.features_judges`.

Who calls what: :func:`firstlight_bench.tools.features.features` calls :func:`check_server` once
per server; it runs each check of :data:`FEATURES` in turn through
:func:`check_feature`, which turns what the check raised into the record (an error
answer to the request carrying the feature: refused; anything else: an error), so one
failing feature or server never stops the run. Each check's docstring says how
"honoured" is judged.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
import openai
from openai.types.chat import ChatCompletion

from firstlight_bench.reports.features_report import FeatureResult, ServerFeatures
from firstlight_bench.tools.features_judges import (
    Verdict,
    judge_echo,
    judge_json_object,
    judge_json_schema,
    judge_logit_bias,
    judge_logprobs,
    judge_min_tokens,
    judge_model_object,
    judge_n,
    judge_named_tool,
    judge_sampling,
    judge_seed,
    judge_stop,
    pick_stop_word,
)

__all__ = [
    "CITY_SCHEMA",
    "FEATURES",
    "WEATHER_PARAMETERS",
    "BiasToken",
    "InconclusiveError",
    "Target",
    "check_feature",
    "check_server",
]

_T = TypeVar("_T")

CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
"""The ``json_schema`` check's schema."""

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
"""The parameters of the one tool the named ``tool_choice`` check offers."""

_TOOL = "get_weather"
_TOP_LOGPROBS = 3
_ECHO_PROMPT = "The capital of France is"
_STORY = "Write a short story about a cat."


@dataclass(frozen=True)
class BiasToken:
    """The token the ``logit_bias`` check pushes: its id and its decoded text."""

    token_id: int
    piece: str


@dataclass(frozen=True)
class Target:
    """One server as the checks see it."""

    client: openai.AsyncOpenAI
    model: str
    bias: BiasToken | None
    """``None`` when no tokenizer was found (the ``logit_bias`` check then errs)."""


class InconclusiveError(Exception):
    """A check could not be judged: a baseline request (without the feature) failed or
    gave nothing to test against. Recorded as an error, not as a refusal."""


async def _baseline(request: Awaitable[_T]) -> _T:
    """Await a request that carries no feature: its failure is not the feature's."""
    try:
        return await request
    except openai.OpenAIError as exc:
        raise InconclusiveError(f"the baseline request failed: {_error_text(exc)}") from exc


async def _chat(
    target: Target, prompt: str, max_tokens: int, temperature: float = 0.0, **fields: Any
) -> ChatCompletion:
    """One chat completion, not streamed, with ``fields`` as the client's parameters."""
    answer: ChatCompletion = await target.client.chat.completions.create(
        model=target.model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=temperature,
        stream=False,
        **fields,
    )
    return answer


async def json_schema(target: Target) -> Verdict:
    """``response_format`` ``json_schema`` (strict): honoured when the answer parses as
    JSON and validates against :data:`CITY_SCHEMA` (:func:`judge_json_schema`)."""
    answer = await _chat(
        target,
        "What is the capital of France? Answer in JSON with the city and its country.",
        96,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "capital", "schema": CITY_SCHEMA, "strict": True},
        },
    )
    return judge_json_schema(answer, CITY_SCHEMA)


async def json_object(target: Target) -> Verdict:
    """``response_format`` ``json_object``: honoured when the answer is valid JSON or,
    cut at ``max_tokens``, a valid JSON prefix (a small model in JSON mode can nest
    without end; :func:`judge_json_object`)."""
    answer = await _chat(
        target,
        "Describe Paris as a JSON object with the keys name and country.",
        48,
        response_format={"type": "json_object"},
    )
    return judge_json_object(answer)


async def tool_choice_named(target: Target) -> Verdict:
    """A named ``tool_choice`` with one tool: honoured when a call to it comes back with
    ``arguments`` that parse as JSON matching :data:`WEATHER_PARAMETERS`
    (:func:`judge_named_tool`)."""
    answer = await _chat(
        target,
        "What is the weather like in Paris today?",
        64,
        tools=[
            {
                "type": "function",
                "function": {
                    "name": _TOOL,
                    "description": "The current weather in a city.",
                    "parameters": WEATHER_PARAMETERS,
                },
            }
        ],
        tool_choice={"type": "function", "function": {"name": _TOOL}},
    )
    return judge_named_tool(answer, _TOOL, WEATHER_PARAMETERS)


async def logprobs(target: Target) -> Verdict:
    """``logprobs=True`` with ``top_logprobs=3``: honoured when every content token has
    a logprob and three alternatives (:func:`judge_logprobs`)."""
    answer = await _chat(target, "Name a colour.", 8, logprobs=True, top_logprobs=_TOP_LOGPROBS)
    return judge_logprobs(answer, _TOP_LOGPROBS)


async def n_choices(target: Target) -> Verdict:
    """``n=2`` at temperature 1.0: honoured when two choices with indexes 0 and 1 come
    back (:func:`judge_n`)."""
    answer = await _chat(target, _STORY, 8, temperature=1.0, n=2)
    return judge_n(answer, 2)


async def seed(target: Target) -> Verdict:
    """``seed`` at temperature 1.0: honoured when two requests with the same seed give
    the same text; a third with another seed is reported, not judged
    (:func:`judge_seed`)."""
    first = await _chat(target, _STORY, 24, temperature=1.0, seed=1234)
    again = await _chat(target, _STORY, 24, temperature=1.0, seed=1234)
    other = await _chat(target, _STORY, 24, temperature=1.0, seed=4321)
    return judge_seed(first, again, other)


async def stop(target: Target) -> Verdict:
    """``stop``: a greedy answer without it gives a word (:func:`pick_stop_word`); asked
    again with that word as the stop string, honoured when the answer does not contain
    it and ends with ``finish_reason == "stop"`` (:func:`judge_stop`)."""
    prompt = "Write two sentences about the sea."
    free = await _baseline(_chat(target, prompt, 40))
    word = pick_stop_word((free.choices[0].message.content or "") if free.choices else "")
    if word is None:
        raise InconclusiveError("the unconstrained answer has no word to stop at")
    return judge_stop(free, await _chat(target, prompt, 40, stop=[word]), word)


async def min_tokens(target: Target) -> Verdict:
    """vLLM's ``min_tokens`` (``extra_body``): a short greedy answer's length plus 8 is
    asked for; honoured when at least that many tokens come back
    (:func:`judge_min_tokens`)."""
    prompt = "Is the sky blue? Answer yes or no."
    free = await _baseline(_chat(target, prompt, 64))
    if free.usage is None:
        raise InconclusiveError("the unconstrained answer has no usage")
    wanted = free.usage.completion_tokens + 8
    forced = await _chat(target, prompt, wanted + 8, extra_body={"min_tokens": wanted})
    return judge_min_tokens(free, forced, wanted)


async def sampling_extras(target: Target) -> Verdict:
    """``presence_penalty``, ``frequency_penalty`` and (``extra_body``)
    ``repetition_penalty``, ``top_k``, ``min_p`` in one request: accepted when it is
    answered. Honoured when ``top_k=1`` at temperature 1.0 gives the greedy answer and
    ``repetition_penalty=2`` changes a greedy repetitive one (:func:`judge_sampling`)."""
    await _chat(
        target,
        _STORY,
        16,
        temperature=0.8,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        extra_body={"repetition_penalty": 1.2, "top_k": 5, "min_p": 0.1},
    )
    poem = "Write a short poem about the moon."
    greedy = await _baseline(_chat(target, poem, 32))
    top_k_one = await _chat(target, poem, 32, temperature=1.0, extra_body={"top_k": 1})
    repeat = "Repeat the word hello twenty times."
    repetitive = await _baseline(_chat(target, repeat, 32))
    penalised = await _chat(target, repeat, 32, extra_body={"repetition_penalty": 2.0})
    return judge_sampling(greedy, top_k_one, repetitive, penalised)


async def models_retrieve(target: Target) -> Verdict:
    """``GET /v1/models/{id}``: honoured when the model object with that id comes back
    (:func:`judge_model_object`)."""
    return judge_model_object(await target.client.models.retrieve(target.model), target.model)


async def logit_bias(target: Target) -> Verdict:
    """``logit_bias`` of +100 on one token id (from the model's tokenizer): honoured
    when the greedy answer is nothing but that token (:func:`judge_logit_bias`)."""
    if target.bias is None:
        raise InconclusiveError("no tokenizer to take a token id from (see --tokenizer)")
    answer = await _chat(target, "Say something.", 8, logit_bias={str(target.bias.token_id): 100})
    return judge_logit_bias(answer, target.bias.piece)


async def echo(target: Target) -> Verdict:
    """The completions API with ``echo=True``: honoured when the text starts with the
    prompt (:func:`judge_echo`)."""
    answer = await target.client.completions.create(
        model=target.model, prompt=_ECHO_PROMPT, max_tokens=8, temperature=0, echo=True
    )
    return judge_echo(answer, _ECHO_PROMPT)


Check = Callable[[Target], Awaitable[Verdict]]

FEATURES: dict[str, Check] = {
    "json_schema": json_schema,
    "json_object": json_object,
    "tool_choice_named": tool_choice_named,
    "logprobs": logprobs,
    "n": n_choices,
    "seed": seed,
    "stop": stop,
    "min_tokens": min_tokens,
    "sampling_extras": sampling_extras,
    "models_retrieve": models_retrieve,
    "logit_bias": logit_bias,
    "echo": echo,
}
"""Every check by feature name, in the order of
:data:`~firstlight_bench.reports.features_report.FEATURE_TITLES` (a test holds them equal)."""


def _error_text(exc: BaseException, limit: int = 200) -> str:
    if isinstance(exc, openai.APIStatusError):
        detail = exc.message.removeprefix(f"Error code: {exc.status_code}").lstrip(" -")
        if not detail and exc.body is not None:  # e.g. FastAPI's own {"detail": "Not Found"}
            detail = json.dumps(exc.body)
        text = f"HTTP {exc.status_code}: {detail}".rstrip(": ")
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def check_feature(name: str, target: Target) -> FeatureResult:
    """Run the check ``name`` against ``target`` and record what happened: its verdict
    when every request was answered; *refused* (with the HTTP status) when the request
    carrying the feature got an error answer; an error for no answer, an inconclusive
    baseline or a check that failed. Never raises (but re-raises cancellation).
    Called by :func:`check_server`, once per feature."""
    try:
        verdict = await FEATURES[name](target)
    except InconclusiveError as exc:
        return FeatureResult(name, False, False, "not judged", error=str(exc))
    except openai.APIStatusError as exc:
        return FeatureResult(
            name, False, False, "", error=_error_text(exc), http_status=exc.status_code
        )
    except Exception as exc:  # a server's odd answer must not stop the run
        return FeatureResult(name, False, False, "", error=_error_text(exc))
    return FeatureResult(name, True, verdict.honoured, verdict.evidence)


async def check_server(
    server: str,
    base_url: str,
    model: str,
    bias: BiasToken | None,
    features: list[str],
    *,
    timeout_s: float = 120.0,
    http_client: httpx2.AsyncClient | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> ServerFeatures:
    """Every feature of ``features`` (names of :data:`FEATURES`) on the server at
    ``base_url`` (``.../v1``), one at a time, each request without retries and within
    ``timeout_s``. ``http_client`` is the official client's ``httpx2.AsyncClient`` (the
    tests pass one on a mock transport). Called by :func:`firstlight_bench.tools.features.features`
    for each server."""
    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key="features",
        max_retries=0,
        timeout=timeout_s,
        http_client=http_client,
    )
    target = Target(client, model, bias)
    results = []
    try:
        for name in features:
            result = await check_feature(name, target)
            progress(f"features: {server} {name}: {result.outcome}")
            results.append(result)
    finally:
        await client.close()
    return ServerFeatures(server, base_url, tuple(results))
