"""The live load driver: offline against scripted SSE streams (``httpx.MockTransport``,
our own client's test seam) for measurement, error handling and open-loop timing; then
one replay through ``run_live`` against a real local platform of two regions of ``sim``
replicas."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from firstlight_bench.clients.driver import region_index, replay
from firstlight_bench.clients.live import run_live
from firstlight_bench.reports.results import Outcome, validate_results
from firstlight_bench.workloads import TraceRequest, Workload
from tests.serve.cluster import platform_config, sim_model

EAST_URL, WEST_URL = "http://gw.test/r-east", "http://gw.test/r-west"
TARGETS = (EAST_URL, WEST_URL)


class FakeTime:
    """A clock the test owns: ``sleep`` advances it (after letting in-flight streams run
    for a moment of real time), and scripted streams advance it between events."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0.02)
        self.now += seconds


def _request(i: int, arrival_s: float, region: int = 0, prompt_len: int = 10) -> TraceRequest:
    prompt = (100 + i, *range(1, prompt_len))
    return TraceRequest(f"t-{i}", arrival_s, region, prompt, 4, None)


def _workload(requests: list[TraceRequest]) -> Workload:
    return Workload("W1", 0, 1.0, {}, tuple(requests), 2)


def _sse(event: dict[str, Any] | str) -> bytes:
    payload = event if isinstance(event, str) else json.dumps(event)
    return f"data: {payload}\n\n".encode()


def _text(text: str) -> bytes:
    return _sse({"choices": [{"index": 0, "text": text, "finish_reason": None}]})


def _usage(prompt: int, completion: int, cached: int) -> bytes:
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    return _sse({"choices": [], "usage": usage})


class Script:
    """The fake gateway: one scripted behaviour per request (by the prompt's first id)."""

    def __init__(self, fake: FakeTime) -> None:
        self.fake = fake
        self.sent: dict[int, float] = {}
        self.bodies: dict[int, dict[str, Any]] = {}
        self.urls: dict[int, str] = {}

    def headers(self, region: str, replica: str) -> dict[str, str]:
        return {
            "content-type": "text/event-stream",
            "x-firstlight-region": region,
            "x-firstlight-replica": replica,
            "x-firstlight-simulated": "true",
        }

    async def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        key = body["prompt"][0] - 100
        self.sent[key] = self.fake.now
        self.bodies[key] = body
        self.urls[key] = str(request.url)
        fake = self.fake

        async def ok() -> AsyncIterator[bytes]:
            fake.now += 0.25  # time to first token
            yield _sse({"choices": [{"index": 0, "text": "", "finish_reason": None}]})
            yield _text(" a")
            fake.now += 0.1
            yield _text(" b")
            yield _text(" c")
            yield _usage(10, 3, 8)
            fake.now += 0.05
            yield _sse("[DONE]")

        async def no_usage() -> AsyncIterator[bytes]:
            yield _text(" x")
            yield _text(" y")
            yield _sse("[DONE]")

        async def mid_error() -> AsyncIterator[bytes]:
            yield _text(" a")
            yield _sse({"error": {"message": "replica died", "code": "internal_error"}})
            yield _sse("[DONE]")

        async def hangs() -> AsyncIterator[bytes]:
            yield _text(" a")
            await asyncio.sleep(30)
            yield _sse("[DONE]")

        if key == 0:
            predicted = {"x-firstlight-predicted-ttft-ms": "200.0"}
            headers = {**self.headers("r-west", "rep-1"), **predicted}
            return httpx.Response(200, headers=headers, content=ok())
        if key == 1:
            garbled = {"x-firstlight-predicted-ttft-ms": "soon"}
            headers = {**self.headers("elsewhere", "rep-9"), **garbled}
            return httpx.Response(200, headers=headers, content=no_usage())
        if key == 2:
            error = {"error": {"message": "no replica", "type": "service_unavailable"}}
            return httpx.Response(503, json=error)
        if key == 3:
            return httpx.Response(200, headers=self.headers("r-east", "rep-2"), content=mid_error())
        if key == 4:
            return httpx.Response(200, headers=self.headers("r-east", "rep-2"), content=hangs())
        raise httpx.ConnectError("refused", request=request)


def _run(script: Script, workload: Workload, **kwargs: Any) -> list[Outcome]:
    async def go() -> list[Outcome]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(script.handler)) as client:
            return await replay(
                workload,
                TARGETS,
                model="m",
                client=client,
                clock=script.fake.clock,
                sleep=script.fake.sleep,
                **kwargs,
            )

    return asyncio.run(go())


def test_replay_measures_streams_and_turns_failures_into_outcomes() -> None:
    fake = FakeTime()
    script = Script(fake)
    arrivals = [0.5, 1.0, 2.0, 3.0, 4.0, 5.0]
    workload = _workload([_request(i, a, region=i % 2) for i, a in enumerate(arrivals)])

    outcomes = _run(script, workload, timeout_s=0.3)

    assert [o.request_id for o in outcomes] == [f"t-{i}" for i in range(6)]
    # Open loop: nothing is sent before its arrival.
    assert all(script.sent[i] >= arrivals[i] for i in range(6)), script.sent
    body = script.bodies[0]
    assert body["prompt"] == [100, *range(1, 10)]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["model"]) == (4, 0, "m")
    assert script.urls[0] == f"{EAST_URL}/v1/completions"
    assert script.urls[1] == f"{WEST_URL}/v1/completions"

    ok = outcomes[0]
    assert ok.error is None
    assert ok.ttft_ms == pytest.approx(250.0)
    assert ok.finish_s == pytest.approx(0.5 + 0.25 + 0.1 + 0.05)
    assert (ok.prompt_tokens, ok.output_tokens, ok.cached_tokens) == (10, 3, 8)
    assert (ok.client_region, ok.served_region, ok.replica) == (0, 1, "rep-1")
    # The gateway's prediction, counted from the scheduled arrival (sent on time here).
    assert ok.predicted_ttft_ms == pytest.approx(200.0 + (script.sent[0] - 0.5) * 1000.0)

    fallback = outcomes[1]
    assert fallback.error is None
    assert (fallback.prompt_tokens, fallback.output_tokens, fallback.cached_tokens) == (10, 2, 0)
    assert (fallback.served_region, fallback.replica) == (None, "rep-9")
    assert fallback.predicted_ttft_ms is None  # an unreadable header predicts nothing

    errors = {o.request_id: o.error for o in outcomes[2:]}
    assert errors == {
        "t-2": "HTTP 503",
        "t-3": "stream error: internal_error",
        "t-4": "timeout",
        "t-5": "ConnectError",
    }
    assert all(o.finish_s is None for o in outcomes[2:])
    assert outcomes[3].first_token_s is not None  # a token arrived before the error


def test_replay_is_open_loop_and_ttft_counts_from_the_scheduled_arrival() -> None:
    """Real clock: a slow first request neither delays the next sends (open loop) nor, once
    the concurrency cap makes a request wait, hides the wait from its TTFT."""
    sent: dict[str, float] = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        key = str(json.loads(request.content)["prompt"][0])
        sent[key] = time.monotonic()

        async def stream() -> AsyncIterator[bytes]:
            if key == "100":
                await asyncio.sleep(0.4)
            yield _text(" a")
            yield _sse("[DONE]")

        return httpx.Response(200, content=stream())

    async def go(max_concurrency: int) -> tuple[float, list[Outcome]]:
        workload = _workload([_request(i, 0.1 * i) for i in range(3)])
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            start = time.monotonic()
            outcomes = await replay(
                workload, TARGETS, model="m", client=client, max_concurrency=max_concurrency
            )
            return start, outcomes

    start, outcomes = asyncio.run(go(max_concurrency=4))
    offsets = [sent[str(100 + i)] - start for i in range(3)]
    assert all(offsets[i] >= 0.1 * i for i in range(3)), offsets
    assert offsets[2] < 0.35, offsets  # not held back by the first request's 0.4 s
    assert all(o.error is None for o in outcomes)

    sent.clear()
    _, capped = asyncio.run(go(max_concurrency=1))
    # The second request waited ~0.3 s for the slot; its TTFT includes that wait.
    assert capped[1].ttft_ms is not None
    assert capped[1].ttft_ms >= 250


def test_a_steered_request_crosses_the_emulated_wan_both_ways() -> None:
    """A global load balancer (``steer``) sends request 0 of an east client to the west
    target 100 ms away: it is sent half the round trip late and its tokens count half
    the round trip late, so TTFT, end and prediction grow by the round trip and the
    answer's own timing does not change."""
    fake = FakeTime()
    script = Script(fake)
    asked: list[tuple[str, float]] = []

    def steer(request: TraceRequest, now_s: float) -> tuple[int, float]:
        asked.append((request.request_id, now_s))
        return 1, 100.0

    [steered] = _run(script, _workload([_request(0, 0.0)]), steer=steer)
    [home] = _run(Script(FakeTime()), _workload([_request(0, 0.0)]))
    assert asked == [("t-0", 0.0)]
    assert script.urls[0].startswith(WEST_URL)
    assert script.sent[0] == pytest.approx(0.05)  # the forward leg
    assert home.ttft_ms is not None
    assert steered.ttft_ms is not None
    assert steered.ttft_ms == pytest.approx(home.ttft_ms + 100.0)
    assert steered.e2e_ms == pytest.approx((home.e2e_ms or 0.0) + 100.0)
    assert steered.predicted_ttft_ms == pytest.approx(200.0 + 100.0)
    assert home.predicted_ttft_ms == pytest.approx(200.0)


def test_region_index_matches_the_target_suffix() -> None:
    assert region_index(TARGETS, "r-west") == 1
    assert region_index([f"{EAST_URL}/"], "r-east") == 0
    assert region_index(TARGETS, "east") is None
    assert region_index(TARGETS, None) is None


def test_replay_rejects_no_targets() -> None:
    with pytest.raises(ValueError, match="targets"):
        asyncio.run(replay(_workload([_request(0, 0.0)]), [], model="m"))


# --- against a real local platform ------------------------------------------------

MODEL = "sim-drv"
EAST, WEST = "drv-east", "drv-west"


@pytest.fixture(scope="module")
def platform(serve_port: int) -> Iterator[LocalPlatform]:
    model = sim_model(MODEL)
    regions = [
        {"name": EAST, "peers": [{"region": WEST, "rtt_ms": 30}]},
        {"name": WEST, "peers": [{"region": EAST, "rtt_ms": 30}]},
    ]
    running = start_local(platform_config(serve_port, regions, [model]), timeout_s=120)
    try:
        yield running
    finally:
        stop_local(running)


def test_run_live_replays_w1_against_a_local_platform(
    platform: LocalPlatform, tmp_path: Path
) -> None:
    targets = [platform.endpoints[EAST], platform.endpoints[WEST]]
    out = tmp_path / "live"
    paths = run_live(
        targets=targets,
        workload="W1",
        seed=0,
        rate_rps=8.0,
        requests=20,
        model=MODEL,
        out=out,
        label="firstlight",
        params={"groups": 2, "system_tokens": 128, "question_tokens": 16, "output_tokens": 8},
        command="pytest",
        timeout_s=60.0,
    )

    assert paths["results"] == out / "results.json"
    assert paths["report"].is_file()
    data = json.loads(paths["results"].read_text())
    validate_results(data)
    meta = data["meta"]
    assert meta["simulated"] is True
    assert meta["config"]["targets"] == targets
    assert meta["workload"]["name"] == "W1"
    assert meta["workload"]["params"]["groups"] == 2
    [point] = data["points"]
    assert (point["arm"], point["load"]) == ("firstlight", 8.0)
    assert (point["completed"], point["errors"]) == (20, 0)
    assert point["prefix_hit_rate"] is not None
    assert point["prefix_hit_rate"] > 0
    assert point["cross_region_share"] is not None  # served regions were reported
    assert point["ttft_ms"]["p50"] is not None


@pytest.mark.parametrize(
    "extra",
    [
        ["--target", "ftp://gw.test/r-east"],
        ["--target", EAST_URL, "--target", EAST_URL],
        ["--target", EAST_URL, "--param", "groups"],
        ["--target", EAST_URL, "--workload", "W9"],
        ["--target", EAST_URL, "--param", "groups=0"],
        ["--target", EAST_URL, "--rate", "0"],
    ],
)
def test_bench_run_rejects_bad_input_with_exit_code_2(tmp_path: Path, extra: list[str]) -> None:
    from typer.testing import CliRunner

    from firstlight.cli import app

    args = ["bench", "run", "--model", "m", "--out", str(tmp_path / "o"), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "o").exists()
