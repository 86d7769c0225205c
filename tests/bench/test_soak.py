"""The fault runs' client (every answer checked) and the soak run: scripted answers
through ``httpx.MockTransport`` for the checks, then a short soak against a real local
platform of two regions of ``sim`` replicas (the ten-minute run is the same code)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from firstlight.config import PlatformConfig
from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from firstlight_bench.soak import SoakReport, soak
from firstlight_bench.steady import SteadyLoad
from tests.bench.bench_cli import run_bench
from tests.serve.cluster import platform_config, sim_model

MODEL = "sim-soak-test"
TOKENS = 3


def _sse(*events: Any) -> bytes:
    return b"".join(
        f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events
    )


def _delta(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


USAGE = {"choices": [], "usage": {"completion_tokens": TOKENS, "prompt_tokens": 5}}
GOOD_STREAM = _sse(_delta("a"), _delta("b"), USAGE, "[DONE]")
GOOD_BODY = {
    "choices": [{"message": {"role": "assistant", "content": "ab"}}],
    "usage": {"completion_tokens": TOKENS},
}


async def _one_of_each(stream: bytes, body: Any, status: int = 200) -> tuple[Any, Any]:
    """One streamed and one non-streamed request answered with ``stream`` / ``body``."""

    def answer(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["stream"]:
            return httpx.Response(status, content=stream, headers={"x-firstlight-route": "local"})
        return httpx.Response(status, json=body)

    load = SteadyLoad("http://gw.test/r", MODEL, clients=1, max_tokens=TOKENS,
                      transport=httpx.MockTransport(answer))  # fmt: skip
    load.start()
    await load.wait_for(2)
    answers = await load.stop()
    streamed = next(a for a in answers if a.stream)
    whole = next(a for a in answers if not a.stream)
    return streamed, whole


async def test_good_answers_count_as_served() -> None:
    streamed, whole = await _one_of_each(GOOD_STREAM, GOOD_BODY)
    assert not streamed.lost
    assert not whole.lost
    assert streamed.route == "local"
    assert streamed.ttft_s is not None
    assert whole.ttft_s is not None


@pytest.mark.parametrize(
    ("stream", "problem"),
    [
        (_sse(_delta("a"), USAGE), "no [DONE]"),
        (_sse(_delta("a"), USAGE, "[DONE]", _delta("b")), "an event after [DONE]"),
        (_sse(_delta("a"), {"error": {"message": "boom"}}, "[DONE]"), "error event: boom"),
        (
            _sse(_delta("a"), {"choices": [], "usage": {"completion_tokens": 1}}, "[DONE]"),
            "1 completion tokens, not 3",
        ),
        (_sse(_delta("a"), {"error": "plain"}, "[DONE]"), "error event: plain"),
        (_sse(_delta("a"), "{not json", "[DONE]"), "JSONDecodeError: "),
    ],
    ids=["no-done", "after-done", "error-event", "short", "string-error", "not-json"],
)
async def test_a_stream_that_fails_a_check_is_lost(stream: bytes, problem: str) -> None:
    streamed, _ = await _one_of_each(stream, GOOD_BODY)
    assert streamed.lost
    assert streamed.problem is not None
    assert streamed.problem.startswith(problem)


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` as an OpenAI-compatible server (vLLM) streams it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


REAL_USAGE = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1_700_000_000,
    "model": MODEL,
    "choices": [],
    "usage": {"prompt_tokens": 5, "completion_tokens": TOKENS, "total_tokens": 5 + TOKENS},
}


def _real_stream(*texts: str) -> bytes:
    """A whole streamed chat answer: the role chunk (empty content, as vLLM sends it),
    one chunk per token text, the finish chunk, the usage chunk and ``[DONE]``."""
    return _sse(
        _chunk({"role": "assistant", "content": ""}),
        *(_chunk({"content": text}) for text in texts),
        _chunk({}, "length"),
        REAL_USAGE,
        "[DONE]",
    )


async def test_a_real_stream_with_text_is_served() -> None:
    streamed, _ = await _one_of_each(_real_stream("Hello", " there", "!"), GOOD_BODY)
    assert streamed.problem is None
    assert streamed.ttft_s is not None  # the first non-empty delta was seen


async def test_a_stream_without_text_is_lost_even_with_done_and_usage() -> None:
    """Every other check passes: 200, no error event, ``[DONE]`` last, ``max_tokens``
    completion tokens in the usage chunk, but each content delta is empty."""
    streamed, _ = await _one_of_each(_real_stream("", "", ""), GOOD_BODY)
    assert streamed.lost
    assert streamed.problem == "no text in the stream"
    assert streamed.ttft_s is None
    # Only the usage chunk and [DONE]: no choices at all.
    streamed, _ = await _one_of_each(_sse(REAL_USAGE, "[DONE]"), GOOD_BODY)
    assert streamed.problem == "no text in the stream"


async def test_a_body_without_text_is_lost() -> None:
    empty = {
        "choices": [{"message": {"role": "assistant", "content": ""}}],
        "usage": {"completion_tokens": TOKENS},
    }
    _, whole = await _one_of_each(GOOD_STREAM, empty)
    assert whole.problem == "no text in the answer"


async def test_a_refused_or_short_body_is_lost() -> None:
    streamed, whole = await _one_of_each(b"", {"error": {"message": "busy"}}, status=503)
    assert streamed.problem is not None
    assert streamed.problem.startswith("HTTP 503")
    assert whole.problem is not None
    assert whole.problem.startswith("HTTP 503")
    short = {"choices": [{"message": {"content": "a"}}], "usage": {"completion_tokens": 1}}
    _, whole = await _one_of_each(GOOD_STREAM, short)
    assert whole.problem == "1 completion tokens, not 3"


def test_the_report_measures_growth_from_the_first_sample_under_load() -> None:
    report = SoakReport(600.0, 3, requests=10, rss_mib={"east/gateway#1": [200.0, 210.0, 220.0]})
    report.tasks_idle_before, report.tasks_idle_after = {"east": 12}, {"east": 12}
    report.tasks_under_load = {"east": [20, 18]}
    assert report.growth_pct("east/gateway#1") == pytest.approx(10.0)
    table = report.markdown()
    assert "| east/gateway#1 | 200 | 220 | +10.0 % |" in table
    assert "| east | 12 | 18 to 20 | 12 |" in table


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--minutes", "0"], "--minutes: 0: must be more than 0"),
        (["--clients", "0"], "'--clients'"),
        (["--sample-s", "-1"], "--sample-s: -1: must be more than 0"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(argv: list[str], message: str) -> None:
    result = run_bench("soak", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


@pytest.mark.parametrize(("lost", "status"), [(0, 0), (1, 1)])
def test_the_exit_status_says_whether_a_request_was_lost(
    lost: int, status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command around :func:`soak`, with the platform and the load replaced."""
    import ray

    from firstlight.serve import local_mode

    deployed: list[str] = []
    running = LocalPlatform(PlatformConfig(), {"soak-east": "http://east.test"}, False, "off")
    monkeypatch.setattr(local_mode, "start_local", lambda config, **_: running)
    monkeypatch.setattr(local_mode, "stop_local", lambda p: deployed.append("stopped"))
    monkeypatch.setattr(ray, "shutdown", lambda: deployed.append("ray down"))

    async def fake_soak(*args: Any, **kwargs: Any) -> SoakReport:
        return SoakReport(60.0, kwargs["clients"], requests=10, lost=lost)

    monkeypatch.setattr("firstlight_bench.soak.soak", fake_soak)
    result = run_bench("soak", "--minutes", "1", "--clients", "2", "--no-tracemalloc")
    assert result.exit_code == status, result.output
    assert deployed == ["stopped", "ray down"]
    assert "2 closed-loop clients per region" in result.stdout
    assert f"10 requests, {lost} lost" in result.stdout


@pytest.fixture(scope="module")
def platform(serve_port: int) -> Iterator[LocalPlatform]:
    config = platform_config(
        serve_port,
        [
            {"name": "soakt-east", "peers": [{"region": "soakt-west", "rtt_ms": 10}]},
            {"name": "soakt-west", "peers": [{"region": "soakt-east", "rtt_ms": 10}]},
        ],
        [sim_model(MODEL, replicas=1)],
    )
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


@pytest.mark.slow
async def test_a_short_soak_finds_every_process_and_loses_nothing(platform: LocalPlatform) -> None:
    lines: list[str] = []
    report = await soak(platform.endpoints, MODEL, 8.0, clients=2, sample_s=3.0,
                        warmup_s=2.0, report=lines.append)  # fmt: skip
    assert report.requests > 10
    assert report.lost == 0, report.problems
    deployments = {p.split("#")[0] for p in report.rss_mib}
    assert deployments == {
        f"{region}/{d}" for region in platform.endpoints for d in ("gateway", f"model-{MODEL}")
    }
    assert all(len(s) >= 2 and min(s) > 10 for s in report.rss_mib.values())
    assert set(report.tasks_idle_before) == set(report.tasks_idle_after) == set(platform.endpoints)
    assert all(count > 0 for count in report.tasks_idle_before.values())
    assert set(report.hint_blocks) == set(platform.endpoints)
    assert max(max(blocks) for blocks in report.hint_blocks.values()) > 0, "hints flowed"
    assert len(lines) >= 2
    print("\n" + report.markdown())
