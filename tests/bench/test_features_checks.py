"""``firstlight bench features``' checks end to end against scripted servers
(``httpx2.MockTransport``): a faithful one honours every feature, one that ignores every
field accepts them all and honours none, a strict one refuses each with its message, and
one that is down gives errors, recorded rather than raised."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx2

from firstlight_bench.reports.features_report import FeatureResult
from firstlight_bench.tools.features_checks import FEATURES, BiasToken, check_server
from tests.bench.test_features import choice, completion_body, token_logprobs, tool_call

_BASIC_FIELDS = frozenset({"model", "messages", "max_tokens", "temperature", "stream", "prompt"})
_STORIES = itertools.count()


def _text_completion(text: str) -> httpx2.Response:
    choice = {"index": 0, "text": text, "finish_reason": "length"}
    body = {"id": "c", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
    return httpx2.Response(200, json=body)


def _faithful_chat(body: dict[str, Any]) -> dict[str, Any]:
    """What a server that honours every field answers (a scripted model)."""
    kind = (body.get("response_format") or {}).get("type")
    if kind == "json_schema":
        return completion_body(choice('{"city": "Paris", "country": "France"}'))
    if kind == "json_object":
        return completion_body(choice('{"name": {"name": {"name": [', finish="length"))
    if "tool_choice" in body:
        return completion_body(
            choice(None, finish="tool_calls", message=tool_call('{"city": "Paris"}'))
        )
    if body.get("logprobs"):
        return completion_body(choice("a b", logprobs=token_logprobs(2, body["top_logprobs"])))
    if body.get("n", 1) > 1:
        return completion_body(*[choice(f"story {i}", i) for i in range(body["n"])])
    if "logit_bias" in body:
        return completion_body(choice(" blue" * 8, finish="length"))
    if "min_tokens" in body:
        return completion_body(
            choice("Yes, it is blue.", finish="length"), tokens=body["min_tokens"]
        )
    prompt = body["messages"][0]["content"]
    if "sea" in prompt:
        text, stop = "The sea is vast and deep.", (body.get("stop") or [None])[0]
        return completion_body(choice(text.partition(stop)[0] if stop else text))
    if "hello" in prompt:
        return completion_body(
            choice("hello world" if "repetition_penalty" in body else "hello hello")
        )
    if "sky" in prompt:
        return completion_body(choice("Yes."), tokens=3)
    if body["temperature"] > 0 and body.get("top_k") != 1:
        return completion_body(choice(f"story {body.get('seed', next(_STORIES))}"))
    return completion_body(choice("The moon is bright."))


def _faithful(request: httpx2.Request) -> httpx2.Response:
    if request.method == "GET":
        model = {"id": request.url.path.rsplit("/", 1)[-1], "object": "model", "created": 0}
        return httpx2.Response(200, json={**model, "owned_by": "x"})
    body = json.loads(request.content)
    if "prompt" in body:
        return _text_completion(body["prompt"] + " Paris." if body.get("echo") else " Paris.")
    return httpx2.Response(200, json=_faithful_chat(body))


def _ignoring(request: httpx2.Request) -> httpx2.Response:
    """A server that ignores every field it does not know and has no model route."""
    if request.method == "GET":
        return httpx2.Response(404, json={"detail": "Not Found"})
    body = json.loads(request.content)
    if "prompt" in body:
        return _text_completion(" Paris.")
    sampled = body["temperature"] > 0
    text = f"story {next(_STORIES)}" if sampled else "Sure, here is what you asked for."
    return httpx2.Response(200, json=completion_body(choice(text)))


def _strict(request: httpx2.Request) -> httpx2.Response:
    """A server that refuses any field beyond the basic ones."""
    if request.method == "POST":
        unknown = sorted(set(json.loads(request.content)) - _BASIC_FIELDS)
        if unknown:
            error = {"message": f"unknown field {unknown[0]}", "type": "invalid_request_error"}
            return httpx2.Response(400, json={"error": error})
    return _ignoring(request)


def _down(request: httpx2.Request) -> httpx2.Response:
    raise httpx2.ConnectError("connection refused", request=request)


_BLUE = BiasToken(4, " blue")


async def _check(handler: Any, bias: BiasToken | None = _BLUE) -> dict[str, FeatureResult]:
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as http_client:
        server = await check_server(
            "s", "http://fake.test/v1", "m", bias, list(FEATURES), http_client=http_client
        )
    assert [r.feature for r in server.results] == list(FEATURES)
    return {r.feature: r for r in server.results}


async def test_a_faithful_server_honours_every_feature() -> None:
    results = await _check(_faithful)
    assert {f: r.outcome for f, r in results.items()} == dict.fromkeys(FEATURES, "honoured")
    assert "cut before 'vast'" in results["stop"].evidence


async def test_a_server_that_ignores_the_fields_accepts_but_honours_none() -> None:
    results = await _check(_ignoring)
    expected = dict.fromkeys(FEATURES, "accepted") | {"models_retrieve": "refused"}
    assert {f: r.outcome for f, r in results.items()} == expected
    assert results["models_retrieve"].error == 'HTTP 404: {"detail": "Not Found"}'


async def test_a_strict_server_refuses_every_feature_with_its_message() -> None:
    results = await _check(_strict)
    assert {f: r.outcome for f, r in results.items()} == dict.fromkeys(FEATURES, "refused")
    assert results["seed"].error == "HTTP 400: unknown field seed"


async def test_a_server_that_is_down_is_recorded_not_raised() -> None:
    results = await _check(_down)
    assert {r.outcome for r in results.values()} == {"error"}
    assert results["stop"].error is not None
    assert "baseline request failed" in results["stop"].error
    assert "APIConnectionError" in (results["n"].error or "")


async def test_without_a_tokenizer_logit_bias_is_not_judged() -> None:
    result = (await _check(_faithful, bias=None))["logit_bias"]
    assert (result.outcome, result.error) == (
        "error",
        "no tokenizer to take a token id from (see --tokenizer)",
    )
