"""Where a process's memory grows: ``tracemalloc`` snapshots compared, grouped by owner.

Who calls what: the soak run (:mod:`firstlight_bench.tools.soak`) reaches every gateway through
its Ray Serve deployment handle (``Gateway.memory_*``, which delegate to a
:class:`MemoryProbe`): it starts tracing before the load, takes a baseline when its
warm-up ends, and asks for the growth since the baseline at the end. Tracing is off
until then — it costs CPU on every allocation and memory per live block — and nothing
else turns it on.

An allocation's *owner* is the module of the innermost frame of its traceback that is
outside the standard library — who asked for the memory, not the ``json``, ``asyncio``
or ``collections`` code that built it on their behalf — rolled up to a package:
``firstlight`` modules whole (``firstlight.hints.mirror``), other third-party code to its
first two names (``ray.serve``, ``starlette.routing``); when every recorded frame is in
the standard library, that innermost frame's top-level module (``asyncio``); an
allocation with no Python frame is ``<unknown>``. The more frames are traced
(``tracemalloc.start(frames)``), the more often the owner is found above the standard
library.

The baseline is not kept as a snapshot (that would hold a tuple per live block, tens of
MiB in a gateway): it is reduced at once to a *census*, the bytes and blocks per owner and
allocation site, and the growth is one census minus the other. The census itself is
memory of this module's, so it shows up as ``firstlight.telemetry.memory`` in the growth;
tracemalloc's own tables (:func:`tracemalloc.get_tracemalloc_memory`) are reported apart.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import tracemalloc
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePath

__all__ = [
    "UNKNOWN_OWNER",
    "Census",
    "MemoryGrowth",
    "MemoryOwner",
    "MemoryProbe",
    "MemoryStatus",
    "MemoryTracer",
    "Owner",
    "census",
    "growth_by_owner",
    "module_of",
    "owner_of",
]

UNKNOWN_OWNER = "<unknown>"
"""The owner of a block allocated with no Python frame on the stack."""

Census = dict[tuple[str, str], tuple[int, int]]
"""``(owner, site)`` → ``(bytes, blocks)`` alive at one moment; a site is
``module:line`` of the frame the owner was read from."""


@dataclass(frozen=True, slots=True)
class MemoryOwner:
    """One owner's net growth between a baseline and now (negative: it shrank)."""

    owner: str
    """Package or module (module docstring), e.g. ``firstlight.hints.mirror``."""
    size_bytes: int
    count: int
    """Net change in live blocks."""
    site: str
    """The owner's allocation site (``module:line``) that grew the most."""
    site_bytes: int
    """That site's net growth."""


@dataclass(frozen=True, slots=True)
class MemoryStatus:
    """A process's tracing state, as :class:`MemoryProbe` reports it."""

    pid: int
    tracing: bool
    frames: int
    """Frames kept per traceback (0 when not tracing)."""
    traced_bytes: int
    """Bytes in live blocks allocated since tracing started."""
    tracemalloc_bytes: int
    """tracemalloc's own memory (its tables), not among ``traced_bytes``."""
    baseline: str | None
    """Label of the baseline held, if any."""


@dataclass(frozen=True, slots=True)
class MemoryGrowth:
    """Traced growth since a baseline, grouped by owner: the top growers, in order."""

    pid: int
    baseline: str
    label: str
    """The label the growth was asked for with (a repeated ask returns the same)."""
    frames: int
    traced_growth_bytes: int
    """Net growth over every owner (the census sums)."""
    tracemalloc_growth_bytes: int
    """Growth of tracemalloc's own tables over the same span (not traced)."""
    owners: tuple[MemoryOwner, ...]
    """The ``top`` owners by growth, largest first."""
    other_bytes: int
    """Net growth of the owners not listed."""


def _roots() -> tuple[str, ...]:
    """``sys.path``'s folders now."""
    return tuple({os.path.abspath(p) for p in sys.path if p})


def _dotted(relative: str) -> str:
    path = PurePath(relative)
    parts = list(path.parts[1:] if path.is_absolute() else path.parts)
    parts[-1] = parts[-1].partition(".")[0]
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def module_of(
    filename: str,
    roots: Sequence[str] | None = None,
    modules: Collection[str] | None = None,
) -> str:
    """The module a traceback's ``filename`` belongs to: the path below the longest of
    ``roots`` (default: this process's ``sys.path``) as a dotted name; for a path below
    none (Cython's relative ``python/ray/_raylet.pyx``) its longest dotted tail among
    ``modules`` (default: ``sys.modules``), else its file name; ``<frozen X>`` is ``X``,
    ``<unknown>`` :data:`UNKNOWN_OWNER`, other ``<...>`` names stay as they are."""
    if filename.startswith("<frozen ") and filename.endswith(">"):
        return filename.removeprefix("<frozen ").removesuffix(">")
    if filename.startswith("<"):
        return filename
    # Longest first: ``.../lib/python3.11/site-packages`` before ``.../lib/python3.11``.
    for root in sorted(_roots() if roots is None else roots, key=len, reverse=True):
        if filename.startswith(root.rstrip(os.sep) + os.sep):
            return _dotted(filename[len(root.rstrip(os.sep)) + 1 :])
    names = _dotted(filename).split(".")
    known = sys.modules if modules is None else modules
    for start in range(len(names)):
        candidate = ".".join(names[start:])
        if candidate in known:
            return candidate
    return names[-1]


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def _rolled_up(module: str, whole: Collection[str], depth: int) -> str:
    top = module.split(".")[0]
    if module == UNKNOWN_OWNER or top in whole:
        return module
    if _is_stdlib(module):
        return top
    return ".".join(module.split(".")[:depth])


def owner_of(
    frames: Iterable[tuple[str, int]],
    module: Callable[[str], str] = module_of,
    *,
    whole: Collection[str] = ("firstlight",),
    depth: int = 2,
) -> tuple[str, str]:
    """``(owner, site)`` of a traceback given as ``(filename, line)`` pairs, oldest first
    (tracemalloc's order): see the module docstring. ``module`` maps a filename to its
    module; top-level packages in ``whole`` keep their full module names, others are cut
    to ``depth`` names."""
    innermost: tuple[str, int] | None = None
    for filename, line in reversed(list(frames)):
        name = module(filename)
        if innermost is None:
            innermost = (name, line)
        if name != UNKNOWN_OWNER and not name.startswith("<") and not _is_stdlib(name):
            return _rolled_up(name, whole, depth), f"{name}:{line}"
    if innermost is None:
        return UNKNOWN_OWNER, UNKNOWN_OWNER
    name, line = innermost
    return _rolled_up(name, whole, depth), f"{name}:{line}"


Owner = Callable[[Iterable[tuple[str, int]]], tuple[str, str]]
"""Traceback (``(filename, line)`` pairs, oldest first) → ``(owner, site)``."""


def census(snapshot: tracemalloc.Snapshot, owner: Owner | None = None) -> Census:
    """Bytes and blocks alive in ``snapshot`` per ``(owner, site)``; ``owner`` defaults to
    :func:`owner_of` with this process's ``sys.path`` and modules as they are now."""
    if owner is None:
        roots, modules = _roots(), frozenset(sys.modules)
        module = functools.cache(lambda name: module_of(name, roots, modules))
        owner = functools.partial(owner_of, module=module)
    counted: Census = {}
    for stat in snapshot.statistics("traceback"):
        key = owner((frame.filename, frame.lineno) for frame in stat.traceback)
        size, count = counted.get(key, (0, 0))
        counted[key] = (size + stat.size, count + stat.count)
    return counted


def growth_by_owner(baseline: Census, now: Census, top: int) -> tuple[list[MemoryOwner], int]:
    """Net growth from ``baseline`` to ``now`` per owner, the ``top`` largest first, and
    the net growth of the rest. Raises ``ValueError`` for a negative ``top``."""
    if top < 0:
        raise ValueError(f"top = {top}: must be >= 0")
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    best: dict[str, tuple[int, str]] = {}
    for key in baseline.keys() | now.keys():
        owner, site = key
        before, now_at = baseline.get(key, (0, 0)), now.get(key, (0, 0))
        grew = now_at[0] - before[0]
        sizes[owner] = sizes.get(owner, 0) + grew
        counts[owner] = counts.get(owner, 0) + now_at[1] - before[1]
        if owner not in best or (grew, site) > best[owner]:
            best[owner] = (grew, site)
    ranked = sorted(sizes, key=lambda o: (-sizes[o], o))
    listed = [MemoryOwner(o, sizes[o], counts[o], best[o][1], best[o][0]) for o in ranked[:top]]
    return listed, sum(sizes[o] for o in ranked[top:])


class MemoryTracer:
    """This process's tracemalloc, started and compared on request (synchronous: the
    snapshots take CPU for a while; :class:`MemoryProbe` runs them off the loop)."""

    def __init__(self, owner: Owner | None = None) -> None:
        self._owner = owner
        self._baseline: tuple[str, Census, int] | None = None
        self._growth: dict[str, MemoryGrowth] = {}

    def status(self) -> MemoryStatus:
        """The tracing state now."""
        tracing = tracemalloc.is_tracing()
        return MemoryStatus(
            pid=os.getpid(),
            tracing=tracing,
            frames=tracemalloc.get_traceback_limit() if tracing else 0,
            traced_bytes=tracemalloc.get_traced_memory()[0],
            tracemalloc_bytes=tracemalloc.get_tracemalloc_memory(),
            baseline=None if self._baseline is None else self._baseline[0],
        )

    def start(self, frames: int) -> MemoryStatus:
        """Start tracing with ``frames`` frames per traceback; when tracing already, keep
        it as it is (the status says with how many frames). Raises ``ValueError`` for
        ``frames`` < 1."""
        if frames < 1:
            raise ValueError(f"frames = {frames}: must be >= 1")
        if not tracemalloc.is_tracing():
            tracemalloc.start(frames)
        return self.status()

    def take_baseline(self, label: str) -> MemoryStatus:
        """Count what is alive now as the baseline ``label``; a no-op when that baseline
        is held already (callers may ask more than once). Raises ``RuntimeError`` when
        tracing is off."""
        if not tracemalloc.is_tracing():
            raise RuntimeError("tracemalloc is not tracing: start it before a baseline")
        if self._baseline is None or self._baseline[0] != label:
            counted = census(tracemalloc.take_snapshot(), self._owner)
            self._baseline = (label, counted, tracemalloc.get_tracemalloc_memory())
            self._growth.clear()
        return self.status()

    def growth(self, label: str, top: int) -> MemoryGrowth:
        """Growth from the baseline to now by owner (the ``top`` largest), computed once
        per ``label`` (a repeated ask returns the first answer). Raises ``RuntimeError``
        without a baseline (or with tracing off), ``ValueError`` for a negative ``top``."""
        if self._baseline is None or not tracemalloc.is_tracing():
            raise RuntimeError("no tracemalloc baseline in this process: take one first")
        if label not in self._growth:
            name, before, tables_before = self._baseline
            now = census(tracemalloc.take_snapshot(), self._owner)
            owners, other = growth_by_owner(before, now, top)
            self._growth[label] = MemoryGrowth(
                pid=os.getpid(),
                baseline=name,
                label=label,
                frames=tracemalloc.get_traceback_limit(),
                traced_growth_bytes=sum(o.size_bytes for o in owners) + other,
                tracemalloc_growth_bytes=tracemalloc.get_tracemalloc_memory() - tables_before,
                owners=tuple(owners),
                other_bytes=other,
            )
        return self._growth[label]

    def stop(self) -> MemoryStatus:
        """Stop tracing and drop the baseline (tracemalloc frees its traces)."""
        tracemalloc.stop()
        self._baseline = None
        self._growth.clear()
        return self.status()


class MemoryProbe:
    """A :class:`MemoryTracer` for a Serve replica's event loop: one operation at a time
    (the soak run may ask a replica twice at once), snapshots in a worker thread so the
    loop keeps serving between the GIL's switches. Built by the gateway deployment."""

    def __init__(self, tracer: MemoryTracer | None = None) -> None:
        self._tracer = MemoryTracer() if tracer is None else tracer
        self._lock = asyncio.Lock()

    async def start(self, frames: int) -> MemoryStatus:
        """:meth:`MemoryTracer.start`."""
        async with self._lock:
            return self._tracer.start(frames)

    async def status(self) -> MemoryStatus:
        """:meth:`MemoryTracer.status`."""
        return self._tracer.status()

    async def take_baseline(self, label: str) -> MemoryStatus:
        """:meth:`MemoryTracer.take_baseline`, on the loop: it stalls the loop for the
        snapshot, once. Its RSS before the snapshot is the soak's reference, and a snapshot
        built while the loop allocates beside it (in a thread) interleaves the two in the
        allocator's arenas, so freeing the snapshot returns less memory to the system."""
        async with self._lock:
            return self._tracer.take_baseline(label)

    async def growth(self, label: str, top: int) -> MemoryGrowth:
        """:meth:`MemoryTracer.growth`, off the loop."""
        async with self._lock:
            return await asyncio.to_thread(self._tracer.growth, label, top)

    async def stop(self) -> MemoryStatus:
        """:meth:`MemoryTracer.stop`."""
        async with self._lock:
            return self._tracer.stop()
