"""``coalesce``: ready chunks leave as one, nothing waits for company, errors and early
closes reach the engine's iterator. Producers are gated by events the test controls, so
nothing depends on timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from firstlight.engine.coalesce import coalesce, merge_chunks
from firstlight.engine.protocol import GenerationChunk, Usage

USAGE = Usage(prompt_tokens=3, completion_tokens=4, cached_prompt_tokens=0)


def chunk(token: int, *, last: bool = False) -> GenerationChunk:
    return GenerationChunk(
        "r1",
        (token,),
        f"t{token}",
        finish_reason="stop" if last else None,
        usage=USAGE if last else None,
    )


class Producer:
    """An engine stream that yields chunk ``i`` once ``release(i)`` was called."""

    def __init__(self, count: int, *, fail_after: int | None = None) -> None:
        self.count = count
        self.fail_after = fail_after
        self.gates = [asyncio.Event() for _ in range(count)]
        self.closed = False

    def release(self, *indexes: int) -> None:
        for index in indexes:
            self.gates[index].set()

    async def stream(self) -> AsyncIterator[GenerationChunk]:
        try:
            for index in range(self.count):
                await self.gates[index].wait()
                if self.fail_after is not None and index == self.fail_after:
                    raise RuntimeError("engine died")
                yield chunk(index, last=index == self.count - 1)
        finally:
            self.closed = True


def test_merge_keeps_order_and_takes_the_last_chunks_ending() -> None:
    merged = merge_chunks([chunk(0), chunk(1), chunk(2, last=True)])
    assert merged.token_ids == (0, 1, 2)
    assert merged.text == "t0t1t2"
    assert merged.finish_reason == "stop"
    assert merged.usage == USAGE
    with pytest.raises(ValueError, match="at least one chunk"):
        merge_chunks([])


async def test_first_chunk_leaves_before_the_second_exists() -> None:
    producer = Producer(3)
    stream = coalesce(producer.stream())
    producer.release(0)
    first = await anext(stream)
    assert first.token_ids == (0,)
    # The second chunk was never released: the first did not wait for it.
    producer.release(1, 2)
    rest = [item async for item in stream]
    assert [token for item in rest for token in item.token_ids] == [1, 2]
    assert rest[-1].finish_reason == "stop"


async def test_chunks_ready_together_leave_as_one_item() -> None:
    producer = Producer(5)
    stream = coalesce(producer.stream())
    producer.release(0)
    assert (await anext(stream)).token_ids == (0,)
    producer.release(1, 2, 3, 4)
    items = [item async for item in stream]
    assert len(items) == 1
    assert items[0].token_ids == (1, 2, 3, 4)
    assert items[0].usage == USAGE


async def test_an_engine_error_arrives_after_the_chunks_before_it() -> None:
    producer = Producer(4, fail_after=2)
    stream = coalesce(producer.stream())
    producer.release(0, 1, 2)
    assert (await anext(stream)).token_ids == (0, 1)
    with pytest.raises(RuntimeError, match="engine died"):
        await anext(stream)


async def test_closing_early_closes_the_engine_stream() -> None:
    producer = Producer(3)
    stream = coalesce(producer.stream())
    producer.release(0)
    await anext(stream)
    await stream.aclose()
    assert producer.closed
    # The pump task is gone: nothing of ours is left on the loop.
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert others == []
