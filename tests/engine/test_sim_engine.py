"""SimEngine on asyncio: streaming with usage, abort, early close, cache events, shutdown
and failure — with an injected sleep, so nothing waits on the wall clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from firstlight.config import HintsConfig, ModelConfig
from firstlight.engine.protocol import (
    CacheEvent,
    Engine,
    GenerationChunk,
    GenerationRequest,
    SamplingSettings,
    Usage,
)
from firstlight.engine.sim import PROFILES, SimEngine, Sleep
from firstlight.errors import EngineDeadError, InvalidRequestError, PromptTooLongError
from firstlight.prefix import HashScheme, hint_hashes
from firstlight.routing import RequestView
from firstlight.routing.cost import CostRates, predict_ttft
from firstlight.routing.views import ReplicaView

CPU = PROFILES["cpu-smollm2-135m"]


def request(request_id: str, tokens: range, max_tokens: int = 4) -> GenerationRequest:
    return GenerationRequest(request_id, tuple(tokens), SamplingSettings(max_tokens=max_tokens))


class FakeSleep:
    """Records each step's duration and lets the loop go on at once."""

    def __init__(self) -> None:
        self.durations: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.durations.append(seconds)
        await asyncio.sleep(0)


class GatedSleep:
    """Each step sleeps until the test releases it; ``entered`` is set once one does."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self._permits = asyncio.Semaphore(0)

    async def __call__(self, seconds: float) -> None:
        self.entered.set()
        await self._permits.acquire()

    def release(self) -> None:
        self._permits.release()


MakeEngine = Callable[..., SimEngine]


@pytest.fixture
async def make_engine() -> AsyncIterator[MakeEngine]:
    """Builds engines, shuts them all down afterwards and checks no task leaked."""
    engines: list[SimEngine] = []

    def make(
        profile: str = "cpu-smollm2-135m", sleep: Sleep | None = None, interval: int = 1
    ) -> SimEngine:
        engine = SimEngine(profile, sleep=sleep or FakeSleep(), stream_interval_tokens=interval)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.shutdown()
    leaked = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leaked == []


async def collect(stream: AsyncIterator[GenerationChunk]) -> list[GenerationChunk]:
    return [chunk async for chunk in stream]


async def test_generate_streams_a_chunk_per_token_ending_with_usage(
    make_engine: MakeEngine,
) -> None:
    sleep = FakeSleep()
    engine: Engine = make_engine(sleep=sleep)
    chunks = await collect(engine.generate(request("a", range(100), max_tokens=5)))
    assert [len(c.token_ids) for c in chunks] == [1] * 5
    assert [c.finish_reason for c in chunks] == [None] * 4 + ["length"]
    assert [c.usage for c in chunks] == [None] * 4 + [Usage(100, 5, 0)]
    assert all(c.request_id == "a" and c.text.startswith(" ") for c in chunks)
    assert sleep.durations == pytest.approx(
        [CPU.step_ms(100, 0, CPU.prefill_context(0, 100)) / 1000] + [CPU.step_ms(0, 1) / 1000] * 4
    )
    warm = await collect(engine.generate(request("b", range(100), max_tokens=2)))
    assert warm[-1].usage == Usage(100, 2, 96)  # 3 blocks of 32; the last token is computed


@pytest.mark.parametrize(
    ("interval", "max_tokens", "sizes"),
    [
        (4, 10, [1, 4, 4, 1]),  # the first token at once, then every 4, the rest at the end
        (4, 5, [1, 4]),
        (3, 1, [1]),
        (64, 9, [1, 8]),
    ],
)
async def test_a_stream_interval_gathers_tokens_after_the_first_as_vllm_does(
    make_engine: MakeEngine, interval: int, max_tokens: int, sizes: list[int]
) -> None:
    engine = make_engine(interval=interval)
    chunks = await collect(engine.generate(request("a", range(100), max_tokens=max_tokens)))
    assert [len(c.token_ids) for c in chunks] == sizes
    assert [c.finish_reason for c in chunks][-1] == "length"
    assert chunks[-1].usage == Usage(100, max_tokens, 0)
    one_by_one = await collect(make_engine().generate(request("a", range(100), max_tokens)))
    assert "".join(c.text for c in chunks) == "".join(c.text for c in one_by_one)


async def test_concurrent_requests_share_steps(make_engine: MakeEngine) -> None:
    sleep = FakeSleep()
    engine = make_engine(sleep=sleep)
    first, second = await asyncio.gather(
        collect(engine.generate(request("a", range(40), max_tokens=3))),
        collect(engine.generate(request("b", range(500, 540), max_tokens=3))),
    )
    assert first[-1].usage == Usage(40, 3, 0)
    assert second[-1].usage == Usage(40, 3, 0)
    assert sleep.durations == pytest.approx(
        [CPU.step_ms(80, 0, 2 * CPU.prefill_context(0, 40)) / 1000] + [CPU.step_ms(0, 2) / 1000] * 2
    )


async def test_the_same_seed_streams_the_same_text(make_engine: MakeEngine) -> None:
    texts = []
    for _ in range(2):
        engine = make_engine()
        chunks = await collect(engine.generate(request("same-id", range(10), max_tokens=6)))
        texts.append("".join(c.text for c in chunks))
    assert texts[0] == texts[1]
    assert len(texts[0].split()) == 6


async def test_abort_ends_the_stream_with_finish_reason_abort(make_engine: MakeEngine) -> None:
    gate = GatedSleep()
    engine = make_engine(sleep=gate)
    stream = engine.generate(request("a", range(50), max_tokens=100))

    async def next_chunk() -> GenerationChunk:
        return await anext(stream)

    first = asyncio.create_task(next_chunk())
    await gate.entered.wait()
    gate.release()
    assert (await first).finish_reason is None
    assert engine.stats().running == 1
    await engine.abort("a")
    last = await anext(stream)
    assert last.finish_reason == "abort"
    assert last.usage == Usage(50, 1, 0)
    assert engine.stats().running == 0
    assert engine.stats().kv_cache_usage == 0.0
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    await engine.abort("a")  # no-op once finished
    await engine.abort("never-seen")


async def test_stats_report_the_profile_rate_until_a_rate_is_measured(
    make_engine: MakeEngine,
) -> None:
    engine = make_engine("cpu-smollm2-135m")
    nominal = PROFILES["cpu-smollm2-135m"].prefill_tokens_per_s
    assert engine.stats().prefill_tokens_per_s == pytest.approx(nominal)
    stream = engine.generate(request("a", range(300), max_tokens=2))
    async for _ in stream:
        pass
    measured = engine.stats().prefill_tokens_per_s
    assert measured is not None
    assert measured < nominal, "measured over whole steps, overhead included"


async def test_closing_a_stream_early_aborts_its_request(make_engine: MakeEngine) -> None:
    engine = make_engine()
    stream = engine.generate(request("a", range(50), max_tokens=100))
    assert (await anext(stream)).finish_reason is None
    await stream.aclose()  # type: ignore[attr-defined]
    stats = engine.stats()
    assert (stats.running, stats.waiting) == (0, 0)


async def test_invalid_requests_raise_before_any_chunk(make_engine: MakeEngine) -> None:
    engine = make_engine()
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        await anext(engine.generate(request("a", range(8), max_tokens=0)))
    with pytest.raises(PromptTooLongError):
        await anext(engine.generate(request("b", range(2048), max_tokens=1)))
    gate = GatedSleep()
    engine = make_engine(sleep=gate)
    pending = asyncio.create_task(collect(engine.generate(request("dup", range(8)))))
    await gate.entered.wait()
    with pytest.raises(InvalidRequestError, match="already in use"):
        await anext(engine.generate(request("dup", range(8))))
    pending.cancel()
    await asyncio.wait([pending])


async def test_cache_events_start_with_a_snapshot_then_follow_the_cache(
    make_engine: MakeEngine,
) -> None:
    engine = make_engine()
    await collect(engine.generate(request("before", range(64), max_tokens=1)))
    events = engine.cache_events()
    snapshot = await anext(events)
    scheme = engine.core.scheme
    assert snapshot == CacheEvent(
        stored=tuple(sorted(hint_hashes(range(64), scheme))), cleared=True
    )
    await collect(engine.generate(request("after", range(1000, 1100), max_tokens=1)))
    assert await anext(events) == CacheEvent(stored=hint_hashes(range(1000, 1100), scheme))
    with pytest.raises(RuntimeError, match="consumer"):
        await anext(engine.cache_events())
    await engine.shutdown()
    assert [event async for event in events] == []


async def test_shutdown_ends_pending_streams_with_engine_dead_error(
    make_engine: MakeEngine,
) -> None:
    gate = GatedSleep()
    engine = make_engine(sleep=gate)
    streams = [
        asyncio.create_task(collect(engine.generate(request(f"r{i}", range(30), max_tokens=50))))
        for i in range(3)
    ]
    await gate.entered.wait()  # a step is in flight
    await engine.shutdown()
    for stream in streams:
        with pytest.raises(EngineDeadError, match="shut down"):
            await stream
    with pytest.raises(EngineDeadError):
        await anext(engine.generate(request("late", range(8))))
    await engine.shutdown()  # idempotent
    assert [event async for event in engine.cache_events()] == []


async def test_a_failing_step_kills_the_engine_and_its_requests(make_engine: MakeEngine) -> None:
    async def broken(seconds: float) -> None:
        raise RuntimeError("simulated fault")

    engine = make_engine(sleep=broken)
    with pytest.raises(EngineDeadError, match="simulated fault"):
        await collect(engine.generate(request("a", range(8))))
    with pytest.raises(EngineDeadError):
        await anext(engine.generate(request("b", range(8))))


async def test_everything_reported_is_labelled_simulated(make_engine: MakeEngine) -> None:
    engine = make_engine("h100-llama-8b")
    assert engine.simulated is True
    assert engine.model_name == "sim/h100-llama-8b"
    assert engine.stats().simulated is True
    card = engine.describe()
    assert card["simulated"] is True
    assert card["profile"] == "h100-llama-8b"
    assert card["profile_settings"]["prefill_ms_per_token"] == pytest.approx(1000 / 55_000)
    named = SimEngine(served_model_name="SmolLM2-135M-Instruct")
    assert named.model_name == "sim/SmolLM2-135M-Instruct"


def test_for_model_takes_block_size_context_and_hash_seed_from_the_config() -> None:
    model = ModelConfig(name="llama", engine="sim", block_size=32, max_model_len=4096)
    engine = SimEngine.for_model(model, HintsConfig(hash_seed=5), profile="h100-llama-8b")
    profile = engine.core.profile
    assert (profile.block_size, profile.max_model_len) == (32, 4096)
    assert profile.kv_cache_tokens == PROFILES["h100-llama-8b"].kv_cache_tokens
    assert engine.core.scheme == HashScheme(32, 5)
    assert engine.model_name == "sim/llama"


def test_for_model_gives_the_simulator_the_models_host_tier() -> None:
    model = ModelConfig(name="llama", engine="sim", block_size=32, sim_host_kv_blocks=640)
    engine = SimEngine.for_model(model, HintsConfig(), profile="h100-llama-8b")
    assert engine.core.profile.host_kv_blocks == 640
    assert engine.core.profile.reload_ms_per_token == pytest.approx(131_072 / 25e6)
    plain = SimEngine.for_model(
        ModelConfig(name="m", engine="sim"), HintsConfig(), profile="h100-llama-8b"
    )
    assert plain.core.profile.host_kv_blocks == 0, "off by default"


def test_for_profile_fits_the_profile_to_the_gateways_hash_scheme() -> None:
    engine = SimEngine.for_profile("cpu-smollm2-135m", model_name="m", scheme=HashScheme(64, 9))
    assert engine.core.scheme == HashScheme(64, 9)
    assert engine.core.profile.kv_cache_blocks == CPU.kv_cache_tokens // 64
    assert engine.model_name == "sim/m"


async def test_a_resumed_request_continues_the_same_output(make_engine: MakeEngine) -> None:
    """The gateway resumes a failed stream with the prompt plus the tokens already sent
    and ``resumed_tokens``; the simulator must carry on exactly where it stopped."""
    engine = make_engine()
    whole = await collect(engine.generate(request("r", range(70), max_tokens=9)))
    tokens = [t for c in whole for t in c.token_ids]
    for done in (1, 4, 8):
        resumed = GenerationRequest(
            "r",
            tuple(range(70)) + tuple(tokens[:done]),
            SamplingSettings(max_tokens=9 - done),
            resumed_tokens=done,
        )
        rest = await collect(engine.generate(resumed))
        assert [t for c in rest for t in c.token_ids] == tokens[done:]
        assert "".join(c.text for c in rest) == "".join(c.text for c in whole[done:])
        assert rest[-1].finish_reason == "length"


async def test_short_prompts_do_not_make_a_replica_look_slow_for_long_ones(
    make_engine: MakeEngine,
) -> None:
    """A replica that served a few short chats is predicted like an identical one that
    served nothing. Measuring whole steps folded the CPU profile's 36 ms step overhead
    into the per-token rate (28 tokens in 69 ms: 406 tokens/s instead of ~860), and a
    940-token prompt was predicted at 2.3 s here against 1.1 s on the peer region's
    fresh replica, so it spilled over and the next request sharing its prefix missed."""
    measured, fresh = make_engine(), make_engine()
    for i, (prompt, output) in enumerate([(28, 16), (16, 16), (40, 16)]):
        await collect(measured.generate(request(f"short-{i}", range(prompt), output)))
    long_prompt = RequestView("long", 940, (), block_size=32)

    def predicted_ms(engine: SimEngine) -> float:
        stats = engine.stats()
        replica = ReplicaView(
            "r",
            "here",
            queue_len=0,
            prefill_tokens_per_s=stats.prefill_tokens_per_s,
            step_ms=stats.step_ms,
        )
        rates = CostRates(
            prefill_tokens_per_s=5000.0,
            step_overhead_ms=5.0,
            decode_ms_per_running_seq=0.05,
            mean_prompt_tokens=512,
        )
        terms = predict_ttft(
            long_prompt,
            replica,
            cached_blocks=0,
            rtt_ms=0.0,
            reserved_tokens=0,
            correction=1.0,
            rates=rates,
        )
        return terms.total_ms

    assert measured.stats().prefill_tokens_per_s == pytest.approx(
        CPU.prefill_tokens_per_s, rel=0.05
    )
    assert measured.stats().step_ms == pytest.approx(CPU.step_ms(0, 1))
    assert predicted_ms(measured) == pytest.approx(predicted_ms(fresh), rel=0.05)
