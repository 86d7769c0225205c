"""The gateway's HTTP behaviour without a Ray cluster: the real FastAPI app
(:func:`~firstlight.api.routes.build_fastapi` over a real
:class:`~firstlight.api.gateway.GatewayCore`), driven in process through
``httpx.ASGITransport``, over a fake region (:mod:`tests.api.fake_region`: real router
state and policy, real simulated engines that do not wait on the wall clock).

``ASGITransport`` hands over a response once the app has sent all of it, so a request is
held in flight by an engine whose steps wait at a :class:`Gate` the test opens, never by
a sleep."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.routing import Route

from firstlight.api.prompts import SIM_VOCABULARY, SimPromptEncoder
from firstlight.api.schemas import ChatMessage
from firstlight.config import PlatformConfig
from firstlight.engine.protocol import GenerationChunk, GenerationRequest, SamplingSettings
from firstlight.engine.sim import SimEngine
from tests.api.fake_region import (
    MODEL,
    REGION,
    FakeGateway,
    Gate,
    fake_gateway,
    gateway_config,
    leaked_tasks,
    no_wait,
    peer_hop,
)
from tests.conftest import REPO_ROOT
from tests.serve.cluster import API_KEY

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"

MakeGateway = Callable[..., Awaitable[FakeGateway]]


def _ray_modules() -> set[str]:
    return {name for name in sys.modules if name == "ray" or name.startswith("ray.")}


@pytest.fixture(scope="module", autouse=True)
def ray_modules_before() -> set[str]:
    """Ray's modules loaded before this module's tests ran (none when run alone)."""
    return _ray_modules()


@pytest.fixture
async def make_gateway() -> AsyncIterator[MakeGateway]:
    """Builds gateways over fake regions (``make(config, replicas=..., sleep=...)``),
    closes them all afterwards and checks that no asyncio task outlived the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(config: PlatformConfig | None = None, **options: Any) -> FakeGateway:
            return await stack.enter_async_context(
                fake_gateway(config or gateway_config(), **options)
            )

        yield make
    assert leaked_tasks() == []


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> FakeGateway:
    """The default gateway: two replicas, no limits beyond the defaults, auth off."""
    return await make_gateway()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-key"
    path.write_text(API_KEY + "\n")
    return path


# --- helpers ---------------------------------------------------------------------------


def chat(content: str = "Hello there", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def text(prompt: str = "Once upon a time", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **fields}


def sse_data(body: str) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, in order."""
    assert body.endswith("\n\n")
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e.removeprefix("data: ") for e in events]


def assert_openai_error(
    response: httpx.Response, status: int, error_type: str, code: str | None = None
) -> dict[str, Any]:
    """``response`` is ``status`` with OpenAI's error body; returns the ``error``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["type"] == error_type
    assert error["code"] == code
    return error


def metric(exposition: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` whose labels include ``labels``."""
    for line in exposition.splitlines():
        if not line.startswith(name + "{"):
            continue
        label_text, value = line[len(name) + 1 :].rsplit("} ", 1)
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            return float(value)
    raise AssertionError(f"no sample {name} with {labels}")


async def in_engine(gate: Gate, request: asyncio.Task[httpx.Response]) -> None:
    """Until the engine holds a step at ``gate`` (``request`` is in flight and waiting
    for its first token); fails if ``request`` ended first."""
    entered = asyncio.ensure_future(gate.entered.wait())
    await asyncio.wait({entered, request}, return_when=asyncio.FIRST_COMPLETED)
    if not entered.done():
        entered.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await entered
        pytest.fail(f"the request ended before reaching the engine: {request.result().text}")


async def uninterrupted_text(
    request_id: str, prompt: tuple[int, ...], max_tokens: int, gw: FakeGateway
) -> str:
    """What one replica that never failed answers to ``request_id`` (the simulator's
    output depends only on its seed, the request id and the position)."""
    model = gw.config.models[0]
    engine = SimEngine.for_model(model, gw.config.hints, profile=model.sim_profile, sleep=no_wait)
    request = GenerationRequest(request_id, prompt, SamplingSettings(max_tokens, temperature=1.0))
    try:
        chunks: list[GenerationChunk] = [c async for c in engine.generate(request)]
    finally:
        await engine.shutdown()
    return "".join(c.text for c in chunks)


def chat_prompt(content: str) -> tuple[int, ...]:
    return SimPromptEncoder().chat([ChatMessage(role="user", content=content)])


# --- completions ------------------------------------------------------------------------


async def test_chat_completion_is_served_by_a_replica_of_the_region(gw: FakeGateway) -> None:
    response = await gw.client.post(CHAT, json=chat("Hello there", max_tokens=5))

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == MODEL
    assert isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": len(chat_prompt("Hello there")),
        "completion_tokens": 5,
        "total_tokens": len(chat_prompt("Hello there")) + 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    headers = response.headers
    assert headers["x-firstlight-route"] == "local"
    assert headers["x-firstlight-region"] == REGION
    assert headers["x-firstlight-replica"] in gw.backend.replica_ids(MODEL)
    assert gw.backend.served == [(body["id"], headers["x-firstlight-replica"])]
    assert headers["x-firstlight-simulated"] == "true"
    assert float(headers["x-firstlight-predicted-ttft-ms"]) > 0
    assert headers["x-firstlight-decision"].startswith(
        f"firstlight: {headers['x-firstlight-replica']}"
    )


async def test_text_completion_counts_the_prompt_as_tokens(gw: FakeGateway) -> None:
    prompt = "Once upon a time"
    response = await gw.client.post(TEXT, json=text(prompt, max_tokens=4))

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    [choice] = body["choices"]
    assert choice["text"]
    assert "message" not in choice
    assert choice["finish_reason"] == "length"
    prompt_tokens = len(SimPromptEncoder().text(prompt))
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["total_tokens"] == prompt_tokens + 4
    assert response.headers["x-firstlight-route"] == "local"
    assert response.headers["x-firstlight-region"] == REGION
    assert response.headers["x-firstlight-replica"] in gw.backend.replica_ids(MODEL)
    assert response.headers["x-firstlight-simulated"] == "true"


async def test_streamed_chat_sends_chunks_a_usage_chunk_then_done(gw: FakeGateway) -> None:
    payload = chat("Hi", max_tokens=4, stream=True, stream_options={"include_usage": True})
    response = await gw.client.post(CHAT, json=payload)

    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-firstlight-replica"] in gw.backend.replica_ids(MODEL)
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    *content, usage = chunks
    assert len(content) == 4  # one token per simulated step
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert content[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in content[1:])
    assert [c["choices"][0]["finish_reason"] for c in content] == [None, None, None, "length"]
    assert all("usage" not in c for c in content)
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 4
    assert usage["usage"]["prompt_tokens"] == len(chat_prompt("Hi"))


async def test_streamed_text_completion_without_include_usage_has_no_usage_chunk(
    gw: FakeGateway,
) -> None:
    response = await gw.client.post(TEXT, json=text(max_tokens=3, stream=True))

    assert response.status_code == 200, response.text
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert [c["object"] for c in chunks] == ["text_completion"] * 3
    assert all(c["choices"] and "usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_a_shared_prompt_prefix_is_cached_on_the_replica_that_holds_it(
    gw: FakeGateway,
) -> None:
    shared = "You are a terse assistant. " + "Background: " + "lorem ipsum " * 80
    first = await gw.client.post(CHAT, json=chat(shared + "First question?", max_tokens=2))
    second = await gw.client.post(CHAT, json=chat(shared + "Second question?", max_tokens=2))

    assert first.status_code == second.status_code == 200
    assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    block_size = gw.config.models[0].block_size
    shared_tokens = len(chat_prompt(shared))
    assert shared_tokens - block_size < cached <= shared_tokens  # every full shared block
    assert cached % block_size == 0
    assert second.headers["x-firstlight-replica"] == first.headers["x-firstlight-replica"]
    assert f"{cached} cached" in second.headers["x-firstlight-decision"]


# --- authentication ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer not-the-key", "Basic " + API_KEY, "Bearer "],
    ids=["missing", "wrong", "not-bearer", "empty"],
)
async def test_auth_refuses_a_request_without_the_right_key(
    make_gateway: MakeGateway, key_file: Path, authorization: str | None
) -> None:
    gw = await make_gateway(gateway_config(key_file=key_file))
    headers = {} if authorization is None else {"authorization": authorization}

    response = await gw.client.post(CHAT, json=chat(), headers=headers)
    assert_openai_error(response, 401, "authentication_error", "invalid_api_key")
    models = await gw.client.get("/v1/models", headers=headers)
    assert_openai_error(models, 401, "authentication_error", "invalid_api_key")
    assert gw.backend.served == []


async def test_auth_accepts_the_configured_key(make_gateway: MakeGateway, key_file: Path) -> None:
    gw = await make_gateway(gateway_config(key_file=key_file))
    headers = {"authorization": f"Bearer {API_KEY}"}

    response = await gw.client.post(CHAT, json=chat(max_tokens=2), headers=headers)
    assert response.status_code == 200, response.text
    assert (await gw.client.get("/v1/models", headers=headers)).status_code == 200
    # Probes need no key.
    assert (await gw.client.get("/healthz")).status_code == 200
    assert (await gw.client.get("/readyz")).status_code == 200


OPERATOR_PATHS = ("/metrics", "/dashboard/api/state")


async def test_the_operator_surfaces_open_only_to_an_operator_key(
    make_gateway: MakeGateway, key_file: Path, tmp_path: Path
) -> None:
    """The hole: /metrics and the dashboard's state (every tenant's advisor rows) had no
    authentication on the public port. With auth on they answer only to an operator key:
    none or a wrong one is 401, a client's key 403."""
    operator_file = tmp_path / "operator"
    operator_file.write_text("an-operators-key\n")
    auth = {
        "enabled": True,
        "api_keys": [{"file": str(key_file)}],
        "operator_keys": [{"file": str(operator_file)}],
    }
    gw = await make_gateway(gateway_config(auth=auth))
    client = {"authorization": f"Bearer {API_KEY}"}
    operator = {"authorization": "Bearer an-operators-key"}
    for path in OPERATOR_PATHS:
        missing = await gw.client.get(path)
        assert_openai_error(missing, 401, "authentication_error", "invalid_api_key")
        wrong = await gw.client.get(path, headers={"authorization": "Bearer guess"})
        assert_openai_error(wrong, 401, "authentication_error", "invalid_api_key")
        refused = await gw.client.get(path, headers=client)
        assert_openai_error(refused, 403, "permission_error", "operator_key_required")
        assert (await gw.client.get(path, headers=operator)).status_code == 200, path
    # An operator key is not a client key either.
    as_client = await gw.client.post(CHAT, json=chat(), headers=operator)
    assert_openai_error(as_client, 401, "authentication_error", "invalid_api_key")
    # The page itself holds no data; the health paths need no key.
    for path in ("/dashboard", "/healthz", "/readyz"):
        assert (await gw.client.get(path)).status_code == 200, path


async def test_replicas_and_cost_terms_are_shown_to_operators_and_peers_only(
    make_gateway: MakeGateway, key_file: Path, tmp_path: Path
) -> None:
    """The hole: every client saw the replica that answered (``x-firstlight-replica``),
    the policy's cost terms (``x-firstlight-decision``) and ``/readyz``'s replica
    counts and hint feed — the region's topology. Now a client sees the route, region
    and predicted TTFT; a key that is also an operator's, and a peer's verified forward,
    see the rest; probes get the status."""
    both_file = tmp_path / "both"
    both_file.write_text("a-key-of-an-operator-who-also-calls\n")
    auth = {
        "enabled": True,
        "api_keys": [{"file": str(key_file)}, {"file": str(both_file)}],
        "operator_keys": [{"file": str(both_file)}],
    }
    gw = await make_gateway(gateway_config(auth=auth))
    client = {"authorization": f"Bearer {API_KEY}"}
    operator = {"authorization": "Bearer a-key-of-an-operator-who-also-calls"}
    hidden = ("x-firstlight-replica", "x-firstlight-decision")
    for stream in (False, True):
        seen = await gw.client.post(CHAT, json=chat(stream=stream), headers=client)
        assert seen.status_code == 200, seen.text
        assert not [h for h in hidden if h in seen.headers], stream
        assert seen.headers["x-firstlight-route"] == "local"
        assert seen.headers["x-firstlight-region"] == gw.region
        shown = await gw.client.post(CHAT, json=chat(stream=stream), headers=operator)
        assert all(h in shown.headers for h in hidden), stream
    forwarded = await gw.client.post(CHAT, **peer_hop(chat()))
    assert all(h in forwarded.headers for h in hidden)
    probe = await gw.client.get("/readyz")
    assert probe.status_code == 200
    assert probe.json() == {"ready": True, "region": gw.region}
    assert (await gw.client.get("/readyz", headers=client)).json() == probe.json()
    detail = (await gw.client.get("/readyz", headers=operator)).json()
    assert detail["replicas"] == {MODEL: len(gw.backend.replica_ids(MODEL))}
    assert "hints" in detail


PUBLIC_PATHS = {
    "/healthz": "liveness probes",
    "/readyz": "readiness probes and DNS health checks (the status only)",
    "/dashboard": "a static page with no data: it asks for the operator key",
    "/openapi.json": "the API's own description (the OpenAI API's shape)",
}


async def test_with_auth_on_nothing_but_the_public_paths_answers_without_a_key(
    make_gateway: MakeGateway, key_file: Path
) -> None:
    """Every route of the gateway, asked without a key (and with hop headers that carry
    no valid signature): 401, except the paths listed as public, each with its reason.
    A route added later without a key check fails here."""
    auth = {"enabled": True, "api_keys": [{"file": str(key_file)}]}
    gw = await make_gateway(gateway_config(auth=auth))
    routes = [r for r in gw.app.routes if isinstance(r, APIRoute | Route)]
    assert {r.path for r in routes} >= set(PUBLIC_PATHS)
    for route in routes:
        path = route.path.replace("{model_id:path}", MODEL)
        for method in sorted((route.methods or set()) - {"HEAD"}):
            for headers in ({}, {"x-firstlight-hop": "east"}):
                response = await gw.client.request(method, path, json=chat(), headers=headers)
                if route.path in PUBLIC_PATHS:
                    assert response.status_code == 200, (method, path, response.text)
                else:
                    assert response.status_code == 401, (method, path, response.text)


async def test_with_auth_off_the_operator_surfaces_stay_open(gw: FakeGateway) -> None:
    for path in OPERATOR_PATHS:
        assert (await gw.client.get(path)).status_code == 200, path


async def test_the_advisor_shows_a_tenant_its_own_cache_hostile_prefix(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    keys = {"acme": "sk-acme-0123456789abcdef", "globex": "sk-globex-0123456789abcdef"}
    refs = []
    for tenant, key in keys.items():
        (tmp_path / tenant).write_text(key)
        refs.append({"file": str(tmp_path / tenant), "tenant": tenant})
    gw = await make_gateway(gateway_config(auth={"enabled": True, "api_keys": refs}))
    static = " ".join(f"Rule {i}: answer in plain words about topic {i * 7}." for i in range(30))

    def as_(tenant: str) -> dict[str, str]:
        return {"authorization": f"Bearer {keys[tenant]}"}

    for i in range(6):  # a request id before the static system prompt: no prefix hit
        system = f"Request {i:04d} on day {i + 3}.\n{static}"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
        response = await gw.client.post(
            CHAT, json={"model": MODEL, "messages": messages, "max_tokens": 1}, headers=as_("acme")
        )
        assert response.status_code == 200, response.text
    ok = await gw.client.post(CHAT, json=chat(max_tokens=1), headers=as_("globex"))
    assert ok.status_code == 200, ok.text

    mine = await gw.client.get("/v1/firstlight/advisor", headers=as_("acme"))
    assert mine.status_code == 200, mine.text
    assert mine.headers["cache-control"] == "no-store"
    body = mine.json()
    assert (body["object"], body["region"]) == ("list", REGION)
    (row,) = body["data"]  # globex's row is not acme's to see
    assert (row["group"], row["model"], row["requests"]) == ("acme", MODEL, 6)
    (finding,) = row["findings"]
    assert finding["kind"] == "variable_prefix"
    assert finding["requests"] == 5
    assert finding["tokens_per_request"] > 5 / 6 * 0.6 * len(static)
    assert finding["saving_ms_per_request"] > 0
    theirs = (await gw.client.get("/v1/firstlight/advisor", headers=as_("globex"))).json()
    assert [(r["group"], r["findings"]) for r in theirs["data"]] == [("globex", [])]
    assert_openai_error(
        await gw.client.get("/v1/firstlight/advisor"),
        401,
        "authentication_error",
        "invalid_api_key",
    )


# --- request bounds ---------------------------------------------------------------------


async def _chunked(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 500):
        yield body[start : start + 500]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_body_over_max_body_bytes_is_413(make_gateway: MakeGateway, declared: bool) -> None:
    gw = await make_gateway(gateway_config(gateway={"max_body_bytes": 2048}))
    big = json.dumps(chat("x" * 3000)).encode()
    content: bytes | AsyncIterator[bytes] = big if declared else _chunked(big)

    response = await gw.client.post(CHAT, content=content)
    assert_openai_error(response, 413, "invalid_request_error")
    assert "2048 bytes" in response.json()["error"]["message"]
    fits = await gw.client.post(CHAT, json=chat("x" * 1500, max_tokens=1))
    assert fits.status_code == 200, fits.text


@pytest.mark.parametrize("path", [CHAT, TEXT])
async def test_a_prompt_over_max_prompt_tokens_is_context_length_exceeded(
    make_gateway: MakeGateway, path: str
) -> None:
    gw = await make_gateway(gateway_config(gateway={"max_prompt_tokens": 200}))
    payload = chat("x" * 300) if path == CHAT else text("x" * 300)

    response = await gw.client.post(path, json=payload)
    error = assert_openai_error(response, 400, "invalid_request_error", "context_length_exceeded")
    assert error["param"] == ("messages" if path == CHAT else "prompt")
    assert "gateway.max_prompt_tokens" in error["message"]
    assert gw.backend.served == []
    ok = await gw.client.post(TEXT, json=text("x" * 200, max_tokens=1))
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_over_max_output_tokens_is_400(
    make_gateway: MakeGateway, field: str
) -> None:
    gw = await make_gateway(gateway_config(gateway={"max_output_tokens": 8}))

    response = await gw.client.post(CHAT, json={**chat(), field: 9})
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["param"] == "max_tokens"
    assert "gateway.max_output_tokens" in error["message"]
    # Without max_tokens the bound is the default.
    default = await gw.client.post(CHAT, json=chat())
    assert default.status_code == 200, default.text
    assert default.json()["usage"]["completion_tokens"] == 8


async def test_an_unknown_model_is_404_model_not_found(gw: FakeGateway) -> None:
    response = await gw.client.post(CHAT, json={**chat(), "model": "no-such-model"})
    error = assert_openai_error(response, 404, "invalid_request_error", "model_not_found")
    assert error["param"] == "model"
    assert MODEL in error["message"]  # names what is served


@pytest.mark.parametrize("content", [b'{"model": "sim-chat", "messages": [', b"\xff\xfe", b""])
async def test_a_body_that_is_not_json_is_400(gw: FakeGateway, content: bytes) -> None:
    response = await gw.client.post(CHAT, content=content)
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["message"].startswith("the body is not valid JSON")


async def test_a_lone_surrogate_is_400_naming_its_field(gw: FakeGateway) -> None:
    body = json.dumps(chat("hi \ud800 there")).encode()  # ASCII JSON with a \ud800 escape
    assert b"\\ud800" in body

    response = await gw.client.post(CHAT, content=body)
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["param"] == "messages.0.content"
    assert error["message"].startswith("messages.0.content: ")
    assert gw.backend.served == []


@pytest.mark.parametrize(
    ("path", "content"),
    [(CHAT, b"[]"), (CHAT, b"null"), (TEXT, b'{"model": "sim-chat", "prompt": ""}')],
    ids=["array", "null", "empty-prompt"],
)
async def test_a_validation_error_without_a_field_does_not_say_none(
    gw: FakeGateway, path: str, content: bytes
) -> None:
    response = await gw.client.post(path, content=content)
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["param"] is None
    assert not error["message"].startswith("None")


@pytest.mark.parametrize("token", [-1, SIM_VOCABULARY, SIM_VOCABULARY + 10**6])
async def test_prompt_token_ids_outside_the_vocabulary_are_refused_here(
    gw: FakeGateway, token: int
) -> None:
    """Token ids the engine would index its embedding table with: refused by the gateway
    with a 400 naming the field, before any replica sees them (removing the check passed
    every fast test before this one; only a Ray-tier fuzz case noticed)."""
    response = await gw.client.post(TEXT, json={**text(), "prompt": [1, 2, token]})
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["param"] == "prompt"
    assert f"token id {token} is outside the model's vocabulary" in error["message"]
    assert gw.backend.requests == []
    last = await gw.client.post(TEXT, json={**text(max_tokens=1), "prompt": [SIM_VOCABULARY - 1]})
    assert last.status_code == 200, last.text


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        (TEXT, {**text(), "prompt": []}, "prompt"),
        (CHAT, {**chat(), "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (CHAT, chat(stop=[1]), "stop"),
    ],
    ids=["empty-token-list", "content-not-text", "stop-not-strings"],
)
async def test_an_error_in_a_union_field_names_the_request_field(
    gw: FakeGateway, path: str, payload: dict[str, Any], param: str
) -> None:
    response = await gw.client.post(path, json=payload)
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["param"] == param


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        (CHAT, chat(n=2), "n"),
        (CHAT, chat(response_format={"type": "json_object"}), "response_format"),
        (
            CHAT,
            chat(messages=[{"role": "user", "content": "x", "tool_call_id": "1"}]),
            "messages.0.tool_call_id",
        ),
        (TEXT, {**text(), "echo": True}, "echo"),
    ],
    ids=["n", "response-format", "message-field", "echo"],
)
async def test_a_simulated_model_refuses_fields_beyond_the_subset_by_name(
    gw: FakeGateway, path: str, payload: dict[str, Any], param: str
) -> None:
    # vLLM's OpenAI layer serves these for vLLM models; a simulated one cannot: a 400
    # naming the field, never a 200 that ignored it.
    response = await gw.client.post(path, json=payload)
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["param"] == param
    assert "simulated model" in error["message"]


# --- admission: per-key concurrency and the gateway's bound ---------------------------

REFUSAL_S = 10.0
"""Longest a refusal may take to come back; one that does not is a request let in."""


async def test_refused_requests_give_their_key_slot_back(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(
        gateway_config(gateway={"max_concurrent_per_key": 1, "max_body_bytes": 2048})
    )
    refusals = [
        await gw.client.post(CHAT, content=b"{"),
        await gw.client.post(CHAT, json={**chat(), "model": "nope"}),
        await gw.client.post(CHAT, content=b"x" * 4096),
        await gw.client.post(CHAT, json=chat(max_tokens=0)),
    ]
    assert [r.status_code for r in refusals] == [400, 404, 413, 400]
    for payload in (chat(max_tokens=2), chat(max_tokens=2, stream=True)):
        response = await gw.client.post(CHAT, json=payload)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_key_over_max_concurrent_per_key_gets_429_with_retry_after(
    make_gateway: MakeGateway, stream: bool
) -> None:
    gate = Gate()
    gw = await make_gateway(gateway_config(gateway={"max_concurrent_per_key": 1}), sleep=gate)
    held = asyncio.create_task(gw.client.post(CHAT, json=chat(max_tokens=2, stream=stream)))
    try:
        await in_engine(gate, held)
        # Bounded: a limiter that let it through would hold it at the gate, and the test
        # would wait out pytest's time-out instead of failing here.
        refused = await asyncio.wait_for(
            gw.client.post(CHAT, json=chat(max_tokens=2)), timeout=REFUSAL_S
        )
        error = assert_openai_error(refused, 429, "rate_limit_error", "rate_limit_exceeded")
        assert "limit 1" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
        assert len(gw.backend.served) == 1  # the refused request never reached a replica
    finally:
        gate.open()
        first = await held
    assert first.status_code == 200, first.text
    again = await gw.client.post(CHAT, json=chat(max_tokens=2))  # the slot is free again
    assert again.status_code == 200, again.text


async def test_a_gateway_at_max_in_flight_refuses_with_503_overloaded(
    make_gateway: MakeGateway,
) -> None:
    gate = Gate()
    gw = await make_gateway(gateway_config(gateway={"max_in_flight": 1}), sleep=gate)
    held = asyncio.create_task(gw.client.post(TEXT, json=text(max_tokens=2)))
    try:
        await in_engine(gate, held)
        refused = await asyncio.wait_for(
            gw.client.post(TEXT, json=text(max_tokens=2)), timeout=REFUSAL_S
        )
        error = assert_openai_error(refused, 503, "service_unavailable", "overloaded")
        assert "gateway.max_in_flight" in error["message"]
        assert refused.headers["retry-after"] == "1"
    finally:
        gate.open()
        first = await held
    assert first.status_code == 200, first.text


# --- the region decision, with no peers ------------------------------------------------


async def test_no_healthy_replica_is_503_with_retry_after(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(replicas={MODEL: 0})

    response = await gw.client.post(CHAT, json=chat())
    error = assert_openai_error(response, 503, "service_unavailable")
    assert error["message"] == (
        f"no healthy replica of {MODEL!r} in region {REGION} "
        "and no peer region could take the request"
    )
    assert response.headers["retry-after"] == "1"
    assert "x-firstlight-replica" not in response.headers
    assert gw.backend.served == []
    ready = await gw.client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["ready"] is False
    assert ready.json()["replicas"] == {MODEL: 0}


async def test_a_predicted_wait_over_admission_wait_ms_is_503_overloaded(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(gateway_config(router={"admission_wait_ms": 1000}))
    assert (await gw.client.post(CHAT, json=chat(max_tokens=1))).status_code == 200

    gw.backend.set_backlog(MODEL, 1_000_000)  # queued prefill on every replica
    response = await gw.client.post(CHAT, json=chat(max_tokens=1))
    error = assert_openai_error(response, 503, "service_unavailable", "overloaded")
    assert f"region {REGION} is overloaded" in error["message"]
    assert "exceeds router.admission_wait_ms (1000 ms)" in error["message"]
    assert response.headers["retry-after"] == "60"  # the predicted wait, capped at a minute
    assert len(gw.backend.served) == 1

    gw.backend.set_backlog(MODEL, 0)
    assert (await gw.client.post(CHAT, json=chat(max_tokens=1))).status_code == 200


async def test_a_queue_built_up_on_the_only_replica_overloads_the_region(
    make_gateway: MakeGateway,
) -> None:
    """No stats trick: a long prompt waiting on the only replica is reserved there, so
    the next request's predicted wait is its prefill."""
    gate = Gate()
    config = gateway_config(replicas=1, router={"admission_wait_ms": 1000})
    gw = await make_gateway(config, sleep=gate)
    long_prompt = asyncio.create_task(gw.client.post(TEXT, json=text("y" * 3000, max_tokens=2)))
    try:
        await in_engine(gate, long_prompt)
        refused = await gw.client.post(TEXT, json=text(max_tokens=2))
        error = assert_openai_error(refused, 503, "service_unavailable", "overloaded")
        wait_ms = float(error["message"].split("queueing wait of ")[1].split(" ms")[0])
        assert wait_ms > 1000
        # Retry-After is the predicted wait, rounded up to a second.
        assert wait_ms / 1000 <= int(refused.headers["retry-after"]) < wait_ms / 1000 + 1.001
    finally:
        gate.open()
        first = await long_prompt
    assert first.status_code == 200, first.text
    after = await gw.client.post(TEXT, json=text(max_tokens=2))
    assert after.status_code == 200, after.text


async def test_a_forwarded_request_is_served_here_never_forwarded_again(gw: FakeGateway) -> None:
    response = await gw.client.post(CHAT, **peer_hop(chat(max_tokens=2)))
    assert response.status_code == 200, response.text
    assert response.headers["x-firstlight-route"] == "local"
    assert response.headers["x-firstlight-replica"] in gw.backend.replica_ids(MODEL)


async def test_a_forwarded_request_with_no_replica_here_is_503(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(replicas={MODEL: 0})

    response = await gw.client.post(CHAT, **peer_hop(chat()))
    error = assert_openai_error(response, 503, "service_unavailable")
    # Not forwarded, so no word of peers.
    assert error["message"] == f"no healthy replica of {MODEL!r} in region {REGION}"
    assert response.headers["retry-after"] == "1"


async def test_a_forwarded_request_over_admission_wait_ms_is_503_overloaded(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(gateway_config(router={"admission_wait_ms": 1000}))
    gw.backend.set_backlog(MODEL, 1_000_000)

    response = await gw.client.post(CHAT, **peer_hop(chat()))
    assert_openai_error(response, 503, "service_unavailable", "overloaded")
    assert response.headers["retry-after"] == "1"
    assert gw.backend.served == []


# --- replica failures -------------------------------------------------------------------


async def test_a_replica_that_fails_before_output_is_retried_on_another(gw: FakeGateway) -> None:
    gw.backend.fail_next(MODEL)

    response = await gw.client.post(CHAT, json=chat(max_tokens=3))
    assert response.status_code == 200, response.text
    [(request_id, failed)] = gw.backend.failed
    assert request_id == response.json()["id"]
    served = response.headers["x-firstlight-replica"]
    assert served != failed
    assert served in gw.backend.replica_ids(MODEL)
    assert gw.backend.served == [(request_id, failed), (request_id, served)]
    assert response.json()["usage"]["completion_tokens"] == 3
    exposition = (await gw.client.get("/metrics")).text
    migrations = "firstlight_request_migrations_total"
    assert metric(exposition, migrations, model=MODEL, outcome="retried") == 1.0
    assert metric(exposition, migrations, model=MODEL, outcome="gave_up") == 0.0


async def test_the_last_replica_failing_before_output_is_503(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(gateway_config(replicas=1))
    gw.backend.fail_next(MODEL)

    response = await gw.client.post(CHAT, json=chat())
    error = assert_openai_error(response, 503, "service_unavailable")
    assert error["message"].startswith(f"no healthy replica of {MODEL!r} in region {REGION}")
    assert response.headers["retry-after"] == "1"
    assert len(gw.backend.failed) == 1
    assert gw.core.telemetry.migrations[(MODEL, "retried")] == 0
    assert gw.core.telemetry.migrations[(MODEL, "gave_up")] == 1


async def test_a_request_whose_attempts_are_used_up_is_503(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(gateway_config(replicas=3, gateway={"max_attempts": 2}))
    gw.backend.fail_next(MODEL, count=2)

    response = await gw.client.post(CHAT, json=chat())
    assert_openai_error(response, 503, "service_unavailable")
    assert response.headers["retry-after"] == "1"
    assert len(gw.backend.failed) == 2
    assert len(gw.backend.replica_ids(MODEL)) == 1  # one healthy replica was not tried
    assert gw.core.telemetry.migrations[(MODEL, "retried")] == 1
    assert gw.core.telemetry.migrations[(MODEL, "gave_up")] == 1


async def test_attempts_used_up_are_not_reported_as_no_healthy_replica(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(gateway_config(replicas=3, gateway={"max_attempts": 2}))
    gw.backend.fail_next(MODEL, count=2)

    response = await gw.client.post(CHAT, json=chat())
    error = assert_openai_error(response, 503, "service_unavailable")
    assert (await gw.client.get("/readyz")).json()["replicas"] == {MODEL: 1}
    assert "no healthy replica" not in error["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_replica_that_fails_mid_stream_is_resumed_seamlessly(
    gw: FakeGateway, stream: bool
) -> None:
    gw.backend.fail_next(MODEL, after_chunks=2)
    payload = chat("Tell me a story", max_tokens=6, stream=stream)
    if stream:
        payload["stream_options"] = {"include_usage": True}

    response = await gw.client.post(CHAT, json=payload)
    assert response.status_code == 200, response.text
    if stream:
        data = sse_data(response.text)
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert all("error" not in c for c in chunks)
        request_id = chunks[0]["id"]
        answer = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
        usage = chunks[-1]["usage"]
    else:
        body = response.json()
        request_id, answer = body["id"], body["choices"][0]["message"]["content"]
        usage = body["usage"]
    [(_, failed)] = gw.backend.failed
    assert gw.backend.served[0][1] == failed
    prompt = chat_prompt("Tell me a story")
    assert answer == await uninterrupted_text(request_id, prompt, 6, gw)  # nothing lost
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["completion_tokens"] == 6
    assert gw.core.telemetry.migrations[(MODEL, "resumed")] == 1
    # The continuation was a ticket of its own, committed before it left: no leg ranked
    # the replicas in the transport, and both legs' routes were released at the end.
    assert len(gw.backend.served) == 2
    assert gw.backend.uncommitted == 0
    state = gw.backend.state(MODEL)
    assert state is not None
    assert request_id not in state.routes
    assert not state.unrouted


# --- models and probes ------------------------------------------------------------------


async def test_models_lists_the_configured_model(gw: FakeGateway) -> None:
    response = await gw.client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    [model] = body["data"]
    assert model["id"] == MODEL
    assert model["object"] == "model"
    assert model["owned_by"] == "firstlight"
    assert model["max_model_len"] == gw.config.models[0].max_model_len
    assert model["simulated"] is True


async def test_one_model_is_retrieved_by_id_and_an_unknown_one_is_404(gw: FakeGateway) -> None:
    response = await gw.client.get(f"/v1/models/{MODEL}")
    assert response.status_code == 200
    assert response.json()["id"] == MODEL
    listed = (await gw.client.get("/v1/models")).json()["data"]
    assert listed == [response.json()]
    missing = await gw.client.get("/v1/models/nope")
    assert_openai_error(missing, 404, "invalid_request_error", code="model_not_found")


async def test_an_adapter_is_listed_served_under_its_name_and_cached_apart(
    make_gateway: MakeGateway,
) -> None:
    adapter = {"name": "tuned", "path": "/lora/tuned"}
    gw = await make_gateway(gateway_config(replicas=1, model={"lora_adapters": [adapter]}))
    listed = (await gw.client.get("/v1/models")).json()["data"]
    assert [(m["id"], m.get("parent"), m.get("root")) for m in listed] == [
        (MODEL, None, None),
        ("tuned", MODEL, "/lora/tuned"),
    ]
    assert (await gw.client.get("/v1/models/tuned")).json() == listed[1]
    shared = "You are a terse assistant. " + "lorem ipsum " * 80

    def ask(model: str, stream: bool = False) -> Awaitable[httpx.Response]:
        body = {**chat(shared + "Question?", max_tokens=2), "model": model, "stream": stream}
        return gw.client.post(CHAT, json=body)

    def cached(response: httpx.Response) -> int:
        return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    first, again, base = await ask("tuned"), await ask("tuned"), await ask(MODEL)
    assert first.json()["model"] == again.json()["model"] == "tuned"
    assert base.json()["model"] == MODEL
    # The adapter's blocks are its own: a repeat hits them, the base model does not.
    assert (cached(first), cached(base)) == (0, 0)
    assert cached(again) >= len(chat_prompt(shared)) - 2 * gw.config.models[0].block_size
    streamed = await ask("tuned", stream=True)
    events = [json.loads(e) for e in sse_data(streamed.text) if e != "[DONE]"]
    assert {e["model"] for e in events} == {"tuned"}


async def test_documents_are_cut_to_the_budget_before_routing(make_gateway: MakeGateway) -> None:
    from firstlight_bench.tools.rag_workload import rag_cases

    gw = await make_gateway(gateway_config(replicas=1, model={"dynamic_context": {}}))
    [case] = rag_cases(seed=5, questions=1, filler=3)

    async def ask(**extension: Any) -> httpx.Response:
        body = chat(case.question, max_tokens=2)
        body["firstlight"] = {"documents": list(case.documents), **extension}
        return await gw.client.post(CHAT, json=body)

    every, cut = await ask(), await ask(context_budget_tokens=50)
    assert every.status_code == cut.status_code == 200
    assert every.headers["x-firstlight-context"].endswith(": 0,1,2,3,4")
    assert cut.headers["x-firstlight-context"].endswith(f": {case.relevant}")
    full = every.json()["usage"]["prompt_tokens"]
    assert cut.json()["usage"]["prompt_tokens"] < full / 3


async def test_a_key_opted_in_to_dynamic_context_has_it_where_others_are_refused(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    from firstlight_bench.tools.rag_workload import rag_cases

    keys = {"rag": "sk-rag-0123456789abcdef", "plain": "sk-plain-0123456789abcdef"}
    refs: list[dict[str, Any]] = []
    for name, key in keys.items():
        (tmp_path / name).write_text(key)
        refs.append({"file": str(tmp_path / name)})
    refs[0]["dynamic_context"] = {"default_budget_tokens": 50}
    gw = await make_gateway(gateway_config(auth={"enabled": True, "api_keys": refs}))
    [case] = rag_cases(seed=5, questions=1, filler=3)
    body = chat(case.question, max_tokens=2)
    body["firstlight"] = {"documents": list(case.documents)}

    def as_(name: str) -> dict[str, str]:
        return {"authorization": f"Bearer {keys[name]}"}

    cut = await gw.client.post(CHAT, json=body, headers=as_("rag"))
    assert cut.status_code == 200, cut.text
    assert cut.headers["x-firstlight-context"].endswith(f": {case.relevant}")
    refused = await gw.client.post(CHAT, json=body, headers=as_("plain"))
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "firstlight.documents"


async def test_healthz_answers_with_the_region(gw: FakeGateway) -> None:
    response = await gw.client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "region": REGION}


async def test_readyz_counts_the_healthy_replicas(gw: FakeGateway) -> None:
    response = await gw.client.get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["ready"] is True
    assert body["region"] == REGION
    assert body["replicas"] == {MODEL: 2}
    assert body["routing_fallbacks"] == {MODEL: 0}


# --- no Ray -----------------------------------------------------------------------------


def test_these_tests_run_without_ray(ray_modules_before: set[str]) -> None:
    """Last in the module: no test above imported Ray, and importing this module and the
    fake does not either (checked in a fresh interpreter, since another module of the
    session may have loaded Ray before these tests ran)."""
    assert _ray_modules() == ray_modules_before
    code = (
        "import sys, tests.api.test_gateway_app, tests.api.fake_region\n"
        "sys.exit('ray' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
