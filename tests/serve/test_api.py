"""The OpenAI-compatible API of a running local platform (sim engines), through the
official ``openai`` client and raw HTTP for the error cases."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from tests.serve.cluster import API_KEY, platform_config

MODEL = "sim-chat"
_AUTH = {"authorization": f"Bearer {API_KEY}"}
CONCURRENCY_LIMIT = 6
LIMIT_KEY = "limit-test-key-0123456789abcdef"
"""A key of its own for the concurrency-limit test: other tests' streams, whose slots the
gateway frees only when it sees their clients leave, never count against it."""


@pytest.fixture(scope="module")
def platform(
    serve_port: int, key_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalPlatform]:
    limit_key_file = tmp_path_factory.mktemp("limit-key") / "api-key"
    limit_key_file.write_text(LIMIT_KEY + "\n")
    config = platform_config(
        serve_port,
        [
            {"name": "api-east", "peers": [{"region": "api-west", "rtt_ms": 20}]},
            {"name": "api-west", "peers": [{"region": "api-east", "rtt_ms": 20}]},
        ],
        [
            {
                "name": MODEL,
                "engine": "sim",
                "replicas": 1,
                "max_model_len": 1024,
                "resources": {"num_cpus": 0},
            }
        ],
        key_file=key_file,
        extra={
            "gateway": {
                "host": "127.0.0.1",
                "port": serve_port,
                "max_concurrent_per_key": CONCURRENCY_LIMIT,
                # Below the defaults, so the bounds test shows they come from the config.
                "max_body_bytes": 1_000_000,
                "max_messages": 64,
                "max_output_tokens": 1021,
                "max_prompt_tokens": 900,
            },
            # Spill-over is tested in test_routing; here every answer comes from api-east.
            "router": {"spill_over_margin_ms": 60_000},
            "auth": {
                "enabled": True,
                "api_keys": [{"file": str(key_file)}, {"file": str(limit_key_file)}],
                "operator_keys": [{"file": str(key_file)}],  # it reads /metrics too
            },
        },
    )
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


@pytest.fixture(scope="module")
def client(platform: LocalPlatform) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{platform.endpoints['api-east']}/v1", api_key=API_KEY) as c:
        yield c


def test_models_list_names_the_configured_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_completion_with_usage_and_route_headers(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=7
    )
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"
    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens == 7
    assert usage.total_tokens == usage.prompt_tokens + 7
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None
    assert raw.headers["x-firstlight-route"] == "local"
    assert raw.headers["x-firstlight-region"] == "api-east"
    assert raw.headers["x-firstlight-replica"] not in ("", "unknown")
    assert float(raw.headers["x-firstlight-predicted-ttft-ms"]) > 0
    assert raw.headers["x-firstlight-simulated"] == "true"


def test_tokens_come_from_the_replicas_own_port(
    platform: LocalPlatform, client: openai.OpenAI
) -> None:
    """``gateway.data_path: replica-port`` (the default): the replica counts the streams
    it served on its port, and the gateway's scrape shows them once its stats arrive."""
    replicas = set()
    for i in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"port {i}"}], max_tokens=2
        )
        replicas.add(raw.headers["x-firstlight-replica"])
    (replica,) = replicas  # one replica in api-east
    endpoint = platform.endpoints["api-east"]

    def served_on_port() -> float:
        text = httpx.get(f"{endpoint}/metrics", headers=_AUTH, timeout=30).text
        return max(
            (
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("firstlight_replica_port_streams_total{")
                and f'replica="{replica}"' in line
            ),
            default=0.0,
        )

    deadline = time.monotonic() + 30  # routing stats arrive every 0.5 s
    while served_on_port() < 3:
        assert time.monotonic() < deadline, "the replica served nothing on its port"


def test_repeated_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "cache me " * 40}]
    create = client.chat.completions.with_raw_response.create
    first = create(model=MODEL, messages=messages, max_tokens=2)  # type: ignore[arg-type]
    raw = create(model=MODEL, messages=messages, max_tokens=2)  # type: ignore[arg-type]
    routes = [
        (
            r.headers["x-firstlight-region"],
            r.headers["x-firstlight-replica"],
            r.headers["x-firstlight-predicted-ttft-ms"],
        )
        for r in (first, raw)
    ]
    assert routes[0][:2] == routes[1][:2], routes
    again = raw.parse()
    assert again.usage is not None
    assert again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    assert cached >= 32 * ((again.usage.prompt_tokens - 1) // 32)


def test_chat_stream_ends_with_usage_when_asked(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text_chunks = [c for c in chunks if c.choices]
    assert text_chunks[0].choices[0].delta.role == "assistant"
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in text_chunks)
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5


def test_completions_plain_and_streamed_agree_on_length(client: openai.OpenAI) -> None:
    plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6)
    assert plain.object == "text_completion"
    assert plain.usage is not None
    assert plain.usage.completion_tokens == 6
    pieces = list(
        client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, stream=True)
    )
    assert pieces[-1].choices[0].finish_reason == "length"
    assert "".join(p.choices[0].text for p in pieces).strip()


def test_token_id_prompt_is_accepted(client: openai.OpenAI) -> None:
    result = client.completions.create(model=MODEL, prompt=[72, 105, 33], max_tokens=3)
    assert result.usage is not None
    assert result.usage.prompt_tokens == 3


def test_sse_wire_format_ends_with_done(platform: LocalPlatform) -> None:
    url = f"{platform.endpoints['api-east']}/v1/chat/completions"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
    }
    with httpx.stream("POST", url, json=body, headers=_auth(), timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert len(events) == 3 + 1


def _auth(key: str = API_KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _chat(content: str = "hi", **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


@pytest.mark.parametrize(
    ("body", "status", "error_type", "param", "code"),
    [
        (b"{not json", 400, "invalid_request_error", None, None),
        (_chat(max_tokens=0), 400, "invalid_request_error", "max_tokens", None),
        (_chat(temperature=5), 400, "invalid_request_error", "temperature", None),
        (_chat(n=2), 400, "invalid_request_error", "n", None),
        ({"model": MODEL, "messages": []}, 400, "invalid_request_error", "messages", None),
        (
            _chat(max_tokens=1020),
            400,
            "invalid_request_error",
            "messages",
            "context_length_exceeded",
        ),
        (_chat("x" * 2000), 400, "invalid_request_error", "messages", "context_length_exceeded"),
        ({**_chat(), "model": "gpt-9"}, 404, "invalid_request_error", "model", "model_not_found"),
    ],
    ids=[
        "malformed-json",
        "max-tokens-0",
        "temperature",
        "n",
        "no-messages",
        "max-tokens-long",
        "prompt-too-long",
        "unknown-model",
    ],
)
def test_invalid_requests_get_openai_errors(
    platform: LocalPlatform,
    body: bytes | dict[str, object],
    status: int,
    error_type: str,
    param: str | None,
    code: str | None,
) -> None:
    url = f"{platform.endpoints['api-east']}/v1/chat/completions"
    if isinstance(body, bytes):
        response = httpx.post(url, content=body, headers=_auth(), timeout=30)
    else:
        response = httpx.post(url, json=body, headers=_auth(), timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == error_type
    assert error["param"] == param
    assert error["code"] == code
    assert error["message"]


def test_oversized_body_is_413(platform: LocalPlatform) -> None:
    url = f"{platform.endpoints['api-east']}/v1/chat/completions"
    response = httpx.post(url, json=_chat("y" * 5_000_000), headers=_auth(), timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        (_chat("z" * 2_000_000), 413, None, "exceeds 1000000 bytes"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * 65},
            400,
            "messages",
            "gateway.max_messages",
        ),
        (_chat(max_tokens=1022), 400, "max_tokens", "gateway.max_output_tokens"),
        # ~970 tokens: fits the 1024-token context, not gateway.max_prompt_tokens (900).
        (_chat("w" * 950), 400, "messages", "gateway.max_prompt_tokens"),
    ],
    ids=["body-bytes", "messages", "output-tokens", "prompt-tokens"],
)
def test_request_bounds_come_from_the_config(
    platform: LocalPlatform, body: dict[str, object], status: int, param: str | None, says: str
) -> None:
    url = f"{platform.endpoints['api-east']}/v1/chat/completions"
    response = httpx.post(url, json=body, headers=_auth(), timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert says in error["message"]


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong-key"}, {"authorization": "Basic abc"}],
    ids=["missing", "wrong", "not-bearer"],
)
def test_bad_api_keys_are_401(platform: LocalPlatform, headers: dict[str, str]) -> None:
    for path, method in (("/v1/chat/completions", "POST"), ("/v1/models", "GET")):
        response = httpx.request(
            method, f"{platform.endpoints['api-east']}{path}", json=_chat(), headers=headers
        )
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_openai_client_with_wrong_key_raises_authentication_error(
    platform: LocalPlatform,
) -> None:
    base_url = f"{platform.endpoints['api-east']}/v1"
    with (
        openai.OpenAI(base_url=base_url, api_key="nope") as c,
        pytest.raises(openai.AuthenticationError),
    ):
        c.models.list()


def test_over_the_concurrency_limit_is_429_then_recovers(platform: LocalPlatform) -> None:
    url = f"{platform.endpoints['api-east']}/v1/chat/completions"
    body = _chat("hold", max_tokens=900, stream=True)
    auth = _auth(LIMIT_KEY)
    with httpx.Client(timeout=30) as http, ExitStack() as streams:
        for _ in range(CONCURRENCY_LIMIT):
            response = streams.enter_context(http.stream("POST", url, json=body, headers=auth))
            assert response.status_code == 200
        refused = http.post(url, json=_chat(max_tokens=2), headers=auth)
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert int(refused.headers["retry-after"]) >= 1
    # The held streams were closed by the client: their slots come back once the gateway
    # sees the disconnects (polled, bounded).
    with httpx.Client(timeout=30) as http:
        for _ in range(100):
            answer = http.post(url, json=_chat(max_tokens=2), headers=auth)
            if answer.status_code != 429:
                break
            time.sleep(0.1)
    assert answer.status_code == 200, answer.text


def test_health_and_readiness(platform: LocalPlatform) -> None:
    base = platform.endpoints["api-west"]
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok", "region": "api-west"}
    probe = httpx.get(f"{base}/readyz")  # a probe's view: the status only
    assert probe.status_code == 200
    assert probe.json() == {"ready": True, "region": "api-west"}
    ready = httpx.get(f"{base}/readyz", headers=_AUTH)  # an operator's: the detail
    assert ready.json()["replicas"] == {MODEL: 1}
