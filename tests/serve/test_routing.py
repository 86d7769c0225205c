"""Routing in a running local platform (deterministic ``sim`` engines): prefix affinity
through the hint store, spill-over from a saturated region, fail-over from a region
without replicas, 503 when nothing can serve, and no request lost on the way."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from firstlight.config import PlatformConfig
from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from tests.serve.cluster import platform_config

MODEL = "sim-route"
_REGIONS = [
    {"name": "rt-east", "peers": [{"region": "rt-west", "rtt_ms": 40}]},
    {"name": "rt-west", "peers": [{"region": "rt-east", "rtt_ms": 40}]},
    {"name": "rt-south", "peers": [{"region": "rt-east", "rtt_ms": 40}]},
    {"name": "rt-north"},
]


def _config(port: int, *, num_gpus: float) -> PlatformConfig:
    model = {
        "name": MODEL,
        "engine": "sim",
        "replicas": 2,
        "max_model_len": 4096,
        "resources": {"num_cpus": 0, "num_gpus": num_gpus},
    }
    return platform_config(port, _REGIONS, [model])


@pytest.fixture(scope="module")
def platform(serve_port: int) -> Iterator[LocalPlatform]:
    """rt-east and rt-west serve; rt-south and rt-north ask for GPUs this machine does
    not have, so their replicas never start (a region whose replicas are gone)."""
    from ray import serve
    from ray.serve.api import RunTarget

    from firstlight.serve.app import region_app

    config = _config(serve_port, num_gpus=0)
    gpu_only = config.model_copy(update={"models": _config(serve_port, num_gpus=1).models})
    serve.run_many(
        [RunTarget(region_app(gpu_only, r), r, f"/{r}") for r in ("rt-south", "rt-north")],
        wait_for_applications_running=False,
    )
    healthy = config.model_copy(
        update={"regions": tuple(r for r in config.regions if r.name in ("rt-east", "rt-west"))}
    )
    running = start_local(healthy, timeout_s=120)
    base = running.endpoints["rt-east"].rsplit("/", 1)[0]
    endpoints = {
        **running.endpoints,
        "rt-south": f"{base}/rt-south",
        "rt-north": f"{base}/rt-north",
    }
    _wait_for(lambda: all(_answers(f"{endpoints[r]}/healthz") for r in ("rt-south", "rt-north")))
    every = LocalPlatform(running.config, endpoints, running.hints_enabled, running.hints_note)
    yield every
    # All four at once: the replicas that never started each wait out their 30 s grace.
    stop_local(every)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_for(condition: Any, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until true (a deadline, not a sleep standing in for sync)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def _chat(url: str, content: str, max_tokens: int = 4, **headers: str) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def _stream(url: str, content: str) -> tuple[dict[str, str], list[str]]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return dict(r.headers), [line for line in r.iter_lines() if line]


def test_shared_prefix_lands_on_the_replica_holding_it(platform: LocalPlatform) -> None:
    east = platform.endpoints["rt-east"]
    prefix = "You are a meticulous assistant. " * 40  # ~1300 tokens in the sim encoding
    first = _chat(east, prefix + "Question 0")
    assert first.status_code == 200
    holder = first.headers["x-firstlight-replica"]
    # The replica announces the prompt's blocks through Redis; wait until the router's
    # mirror holds them (what a second request arriving a moment later would see).
    _wait_for(lambda: httpx.get(f"{east}/readyz").json()["hints"][MODEL]["blocks"] >= 40)
    seen = []
    for i in range(1, 7):
        answer = _chat(east, prefix + f"Question {i}")
        assert answer.status_code == 200
        seen.append(
            (
                answer.headers["x-firstlight-route"],
                answer.headers["x-firstlight-replica"],
                answer.headers["x-firstlight-predicted-ttft-ms"],
                answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
                answer.headers.get("x-firstlight-decision"),
            )
        )
    assert {(route, replica) for route, replica, *_ in seen} == {("local", holder)}, seen
    assert min(cached for *_, cached, _ in seen) >= 1200


def test_saturated_region_spills_over_and_loses_nothing(platform: LocalPlatform) -> None:
    east = platform.endpoints["rt-east"]
    prompts = [f"{i} " + f"distinct long prompt number {i}. " * 50 for i in range(12)]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        results = list(pool.map(lambda p: _stream(east, p), prompts))
    assert len(results) == len(prompts)  # every request answered...
    for _headers, events in results:  # ...completely
        assert events[-1] == "data: [DONE]"
        assert '"finish_reason":"length"' in events[-2]
    routes = [(h["x-firstlight-route"], h["x-firstlight-region"]) for h, _ in results]
    decisions = [h.get("x-firstlight-decision") for h, _ in results]
    assert ("spill_over", "rt-west") in routes, (routes, decisions)
    assert ("local", "rt-east") in routes, (routes, decisions)
    assert {region for _, region in routes} == {"rt-east", "rt-west"}


def test_region_without_replicas_fails_over(platform: LocalPlatform) -> None:
    south = platform.endpoints["rt-south"]
    ready = httpx.get(f"{south}/readyz")
    assert ready.status_code == 503
    assert ready.json()["replicas"] == {MODEL: 0}
    answers = [_chat(south, f"fail over {i}") for i in range(5)]
    assert [a.status_code for a in answers] == [200] * 5
    assert {a.headers["x-firstlight-route"] for a in answers} == {"fail_over"}
    assert {a.headers["x-firstlight-region"] for a in answers} == {"rt-east"}
    assert all(a.json()["choices"][0]["finish_reason"] == "length" for a in answers)


def test_no_capacity_anywhere_is_503_with_retry_after(platform: LocalPlatform) -> None:
    answer = _chat(platform.endpoints["rt-north"], "nobody home")
    assert answer.status_code == 503
    assert answer.json()["error"]["type"] == "service_unavailable"
    assert int(answer.headers["retry-after"]) >= 1


def test_forwarded_request_is_never_forwarded_again(platform: LocalPlatform) -> None:
    answer = _chat(platform.endpoints["rt-south"], "second hop", **{"x-firstlight-hop": "rt-x"})
    assert answer.status_code == 503
    assert "rt-south" in answer.json()["error"]["message"]
