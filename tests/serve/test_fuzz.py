"""Fuzzing the gateway: schemathesis generates requests (valid and invalid) from the
gateway's own OpenAPI document for every operation — more than 1,000 in all — against a
running platform, and every answer must be below 500, with 4xx errors of the API in
OpenAI's shape. Then hand-written nasty inputs: invalid UTF-8, NaN and Infinity, huge
numbers, deep nesting, a 10 MB body, wrong types — always a 4xx in OpenAI's shape.
Real local Ray cluster, ``sim`` engine; generation is seeded (``derandomize``), so a
failure replays."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from firstlight.api.prompts import SIM_VOCABULARY
from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from tests.serve.cluster import API_KEY, platform_config, sim_model
from tests.serve.hostile import Hostile, assert_openai_4xx, hostile_cases

MODEL = "sim-fuzz"
AUTH = {"authorization": f"Bearer {API_KEY}"}
EXAMPLES = {  # (operation, mode) -> generated requests
    ("POST /v1/chat/completions", GenerationMode.POSITIVE): 400,
    ("POST /v1/chat/completions", GenerationMode.NEGATIVE): 300,
    ("POST /v1/completions", GenerationMode.POSITIVE): 250,
    ("POST /v1/completions", GenerationMode.NEGATIVE): 200,
}
OTHER_EXAMPLES = 15
"""Per GET operation (health, models, metrics, dashboard, summary): few inputs exist."""


@pytest.fixture(scope="module")
def fuzzed(serve_port: int, key_file: Path) -> Iterator[LocalPlatform]:
    config = platform_config(
        serve_port,
        [{"name": "fz-east"}],
        [sim_model(MODEL)],
        key_file=key_file,
        extra={
            "gateway": {
                "host": "127.0.0.1",
                "port": serve_port,
                "max_output_tokens": 4,  # valid requests generate a few tokens at most
                "max_concurrent_per_key": 1000,
            }
        },
    )
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


def _check(response: requests.Response, where: str) -> None:
    assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:300]}"
    if 400 <= response.status_code < 500 and "/v1/" in (response.request.path_url or ""):
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, f"{where}: {error}"
        assert isinstance(error["message"], str), where


def _fuzz(base: str, strategy: Any, examples: int, name: str, calls: list[int]) -> None:
    """Run ``examples`` generated requests of one operation through :func:`_check`."""
    session = requests.Session()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        response = case.call(base_url=base, session=session, headers=AUTH, timeout=30)
        calls.append(response.status_code)
        _check(response, f"{name} {case.body!r:.200}")

    run()


def test_schemathesis_finds_no_server_error(fuzzed: LocalPlatform) -> None:
    base = fuzzed.endpoints["fz-east"]
    document = httpx.get(f"{base}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(document)
    operations = {
        f"{o.method.upper()} {o.path}": o for o in (r.ok() for r in schema.get_all_operations())
    }
    assert {"POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models"} <= set(
        operations
    )
    plan = dict(EXAMPLES)
    for name in operations:
        if name.startswith("GET "):
            plan[(name, GenerationMode.POSITIVE)] = OTHER_EXAMPLES
    calls: list[int] = []
    for (name, mode), examples in plan.items():
        _fuzz(base, operations[name].as_strategy(generation_mode=mode), examples, name, calls)
    assert len(calls) >= 1000, len(calls)
    statuses = set(calls)
    assert 200 in statuses  # valid requests were generated and served
    assert statuses & {400, 404, 422}  # and invalid ones refused
    print(f"\nschemathesis: {len(calls)} requests, statuses {sorted(statuses)}, 0 server errors")


CASES = hostile_cases(MODEL, vocabulary=SIM_VOCABULARY)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_nasty_inputs_get_an_openai_shaped_4xx(fuzzed: LocalPlatform, case: Hostile) -> None:
    url = f"{fuzzed.endpoints['fz-east']}{case.path}"
    response = requests.post(url, data=case.body, headers={**AUTH, **case.headers}, timeout=60)
    assert_openai_4xx(response.status_code, response.json(), case.name)
