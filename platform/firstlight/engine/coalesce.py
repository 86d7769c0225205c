"""Merge an engine's output chunks that are ready at once into one chunk.

Called by the ModelServer replica around :meth:`Engine.generate`. Each item a replica
yields is one Ray stream item, and on a small machine each costs about a millisecond of
CPU in Ray's machinery, whatever it carries. When the engine produces tokens faster than
the stream ships them (a fast engine, a loaded host, a slow gateway), those tokens wait
in a queue here and leave as one chunk. Nothing waits for company: the first chunk, and
any chunk that finds the queue empty, is passed on at once, so time to first token and
inter-token latency are unchanged when the stream keeps up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from firstlight.engine.protocol import GenerationChunk

__all__ = ["coalesce", "merge_chunks"]

_End = None
"""Put on the queue when the engine's iterator is exhausted."""


def merge_chunks(chunks: Sequence[GenerationChunk]) -> GenerationChunk:
    """One chunk carrying ``chunks``' tokens and text in order, with the last one's
    ``finish_reason`` and ``usage`` (only a final chunk sets them). Raises
    ``ValueError`` for an empty sequence."""
    if not chunks:
        raise ValueError("merge_chunks needs at least one chunk")
    if len(chunks) == 1:
        return chunks[0]
    last = chunks[-1]
    return GenerationChunk(
        request_id=last.request_id,
        token_ids=tuple(token for chunk in chunks for token in chunk.token_ids),
        text="".join(chunk.text for chunk in chunks),
        finish_reason=last.finish_reason,
        usage=last.usage,
    )


async def coalesce(chunks: AsyncIterator[GenerationChunk]) -> AsyncIterator[GenerationChunk]:
    """Yield ``chunks``, each item merging every chunk that was ready when it was taken.

    The engine's iterator is drained by a task of its own, so it keeps producing while
    the caller is busy shipping the previous item. An exception from the engine is
    raised after the chunks produced before it. Closing this iterator (the client went
    away) cancels that task, which closes the engine's iterator and so aborts the
    request in the engine.
    """
    queue: asyncio.Queue[GenerationChunk | Exception | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for chunk in chunks:
                queue.put_nowait(chunk)
        except Exception as exc:  # handed to the consumer, raised there
            queue.put_nowait(exc)
            return
        queue.put_nowait(_End)

    task = asyncio.get_running_loop().create_task(pump())
    try:
        while True:
            ready: list[GenerationChunk] = []
            item = await queue.get()
            while isinstance(item, GenerationChunk):
                ready.append(item)
                if queue.empty():
                    break
                item = queue.get_nowait()
            if ready:
                yield merge_chunks(ready)
            if isinstance(item, Exception):
                raise item
            if item is _End:
                return
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
