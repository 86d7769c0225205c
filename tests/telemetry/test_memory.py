"""tracemalloc growth grouped by owner (``firstlight.telemetry.memory``): on a real
snapshot of this process (a module written for the test allocates a known amount), and
the owner rules on tracebacks written out by hand."""

from __future__ import annotations

import asyncio
import importlib
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from firstlight.telemetry.memory import (
    UNKNOWN_OWNER,
    Census,
    MemoryProbe,
    MemoryTracer,
    growth_by_owner,
    module_of,
    owner_of,
)

HOG = """\
import json

KEPT = []


def hog(blocks):
    KEPT.extend(bytearray(1024) for _ in range(blocks))


def parsed(items):
    KEPT.append(json.loads("[" + ",".join(['{"k": "v"}'] * items) + "]"))
"""
"""The allocating module: ``hog`` allocates on line 7 itself, ``parsed`` on line 11
through the standard library's ``json``."""

BLOCKS = 2000


@pytest.fixture
def hog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is already tracing in this process (PYTHONTRACEMALLOC?)")
    (tmp_path / "fl_memhog.py").write_text(HOG)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fl_memhog")
    yield module
    if tracemalloc.is_tracing():
        tracemalloc.stop()
    del sys.modules["fl_memhog"]


def test_a_modules_allocations_show_up_as_that_owner_with_their_size(hog: ModuleType) -> None:
    tracer = MemoryTracer()
    tracer.start(4)
    tracer.take_baseline("before")
    hog.hog(BLOCKS)
    grown = tracer.growth("after", top=5)
    tracer.stop()

    top = grown.owners[0]
    assert top.owner == "fl_memhog"
    # Each bytearray: its 1 KiB buffer plus the object; the list holding them grows too.
    assert BLOCKS * 1024 <= top.size_bytes <= BLOCKS * 1300
    assert BLOCKS <= top.count <= 3 * BLOCKS
    assert top.site == "fl_memhog:7"
    assert grown.traced_growth_bytes >= top.size_bytes
    assert grown.traced_growth_bytes == sum(o.size_bytes for o in grown.owners) + grown.other_bytes
    assert grown.frames == 4
    assert grown.baseline == "before"


@pytest.mark.parametrize(
    ("frames", "owner", "site"),
    [(1, "json", "json.decoder:"), (4, "fl_memhog", "fl_memhog:11")],
    ids=["1-frame:the-stdlib-helper", "4-frames:its-caller"],
)
def test_memory_built_by_the_standard_library_belongs_to_its_caller_when_frames_reach_it(
    hog: ModuleType, frames: int, owner: str, site: str
) -> None:
    tracer = MemoryTracer()
    tracer.start(frames)
    tracer.take_baseline("before")
    hog.parsed(5000)
    grown = tracer.growth("after", top=3)
    tracer.stop()
    assert grown.owners[0].owner == owner
    assert grown.owners[0].site.startswith(site)
    assert grown.owners[0].size_bytes > 5000 * 50  # a dict and a string or two per item


def test_freed_memory_is_not_growth(hog: ModuleType) -> None:
    tracer = MemoryTracer()
    tracer.start(2)
    hog.hog(BLOCKS)
    tracer.take_baseline("full")
    hog.KEPT.clear()
    grown = tracer.growth("emptied", top=50)
    tracer.stop()
    owners = {o.owner: o for o in grown.owners}
    assert owners["fl_memhog"].size_bytes <= -BLOCKS * 1024
    assert grown.traced_growth_bytes < 0


def test_baselines_and_growth_are_taken_once_per_label(hog: ModuleType) -> None:
    tracer = MemoryTracer()
    tracer.start(2)
    tracer.take_baseline("a")
    hog.hog(100)
    tracer.take_baseline("a")  # asked again: the first baseline stays
    first = tracer.growth("end", top=3)
    hog.hog(BLOCKS)
    assert tracer.growth("end", top=3) is first
    later = tracer.growth("later", top=3)
    tracer.stop()
    assert first.owners[0].owner == later.owners[0].owner == "fl_memhog"
    assert later.owners[0].size_bytes > first.owners[0].size_bytes + BLOCKS * 1024


def test_without_tracing_or_a_baseline_there_is_no_growth_to_give() -> None:
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is already tracing in this process")
    tracer = MemoryTracer()
    assert tracer.status().tracing is False
    with pytest.raises(RuntimeError, match="not tracing"):
        tracer.take_baseline("x")
    tracer.start(1)
    try:
        with pytest.raises(RuntimeError, match="no tracemalloc baseline"):
            tracer.growth("x", top=3)
        with pytest.raises(ValueError, match="frames = 0"):
            tracer.start(0)
    finally:
        status = tracer.stop()
    assert status.tracing is False
    assert status.baseline is None


async def test_the_probe_answers_concurrent_asks_for_one_label_with_one_growth(
    hog: ModuleType,
) -> None:
    probe = MemoryProbe()
    started = await probe.start(3)
    assert started.tracing
    assert started.frames == 3
    await probe.take_baseline("b")
    hog.hog(200)
    first, second = await asyncio.gather(probe.growth("end", 5), probe.growth("end", 5))
    assert first is second
    assert (await probe.status()).baseline == "b"


# --- the owner rules, on tracebacks written out (oldest frame first) ---------------------

STDLIB = "/py/lib/python3.11"
SITE = "/venv/lib/python3.11/site-packages"
SRC = "/repo/platform"
ROOTS = (STDLIB, SITE, SRC)  # deliberately not longest-first


def _owner(*frames: tuple[str, int]) -> tuple[str, str]:
    return owner_of(frames, lambda name: module_of(name, ROOTS, {"ray._raylet"}))


@pytest.mark.parametrize(
    ("frames", "owner", "site"),
    [
        (
            [(f"{SRC}/firstlight/hints/mirror.py", 12)],
            "firstlight.hints.mirror",
            "firstlight.hints.mirror:12",
        ),
        (
            [(f"{SRC}/firstlight/hints/mirror.py", 40), (f"{STDLIB}/json/decoder.py", 353)],
            "firstlight.hints.mirror",
            "firstlight.hints.mirror:40",
        ),
        (
            [
                (f"{STDLIB}/asyncio/base_events.py", 1922),
                (f"{SITE}/ray/serve/_private/replica.py", 77),
                (f"{STDLIB}/asyncio/tasks.py", 9),
            ],
            "ray.serve",
            "ray.serve._private.replica:77",
        ),
        (
            [(f"{STDLIB}/asyncio/base_events.py", 1922), (f"{STDLIB}/asyncio/events.py", 80)],
            "asyncio",
            "asyncio.events:80",
        ),
        ([(f"{SITE}/starlette/__init__.py", 3)], "starlette", "starlette:3"),
        ([(f"{SITE}/starlette/routing.py", 5)], "starlette.routing", "starlette.routing:5"),
        ([("python/ray/_raylet.pyx", 100)], "ray._raylet", "ray._raylet:100"),
        ([("<frozen importlib._bootstrap>", 241)], "importlib", "importlib._bootstrap:241"),
        ([("<unknown>", 0)], UNKNOWN_OWNER, f"{UNKNOWN_OWNER}:0"),
        ([], UNKNOWN_OWNER, UNKNOWN_OWNER),
    ],
    ids=[
        "ours-whole",
        "stdlib-helper-to-ours",
        "third-party-by-two-names",
        "all-stdlib",
        "package-init",
        "module",
        "cython-relative",
        "frozen",
        "no-frame",
        "empty",
    ],
)
def test_owner_rules(frames: list[tuple[str, int]], owner: str, site: str) -> None:
    assert _owner(*frames) == (owner, site)


def test_site_packages_is_not_read_as_part_of_the_standard_library() -> None:
    nested = "/usr/lib/python3.11/site-packages/redis/asyncio/client.py"
    roots = ("/usr/lib/python3.11", "/usr/lib/python3.11/site-packages")
    assert module_of(nested, roots, set()) == "redis.asyncio.client"


def _census(*entries: tuple[str, str, int, int]) -> Census:
    return {(owner, site): (size, count) for owner, site, size, count in entries}


def test_growth_sums_sites_per_owner_and_ranks_owners_by_net_growth() -> None:
    before = _census(("a", "a:1", 100, 1), ("a", "a:2", 500, 5), ("b", "b:1", 1000, 10))
    after = _census(
        ("a", "a:1", 400, 4), ("a", "a:2", 500, 5), ("b", "b:1", 200, 2), ("c", "c:9", 50, 1)
    )
    owners, other = growth_by_owner(before, after, top=2)
    assert [(o.owner, o.size_bytes, o.count, o.site, o.site_bytes) for o in owners] == [
        ("a", 300, 3, "a:1", 300),
        ("c", 50, 1, "c:9", 50),
    ]
    assert other == -800  # b shrank
    assert growth_by_owner(before, after, top=0) == ([], 300 + 50 - 800)
    with pytest.raises(ValueError, match="top = -1"):
        growth_by_owner(before, after, top=-1)
