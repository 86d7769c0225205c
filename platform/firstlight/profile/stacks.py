"""Collapsed stacks (py-spy's ``--format raw``) and the frames that took the most time.

Pure code, no I/O: :func:`firstlight.profile.record.profile_region` reads each recorded
file and calls :func:`parse_collapsed` then :func:`top_frames`; ``firstlight profile``
prints :func:`render_top_frames`.

The collapsed format (Brendan Gregg's, which py-spy writes) has one line per distinct
stack: the frames from the outermost to the innermost joined by ``;``, a space, and the
number of samples that saw exactly that stack. py-spy's frames read
``function (file.py:line)``, so a frame holds spaces: the count is after the *last* one.
py-spy also writes samples of threads that had no Python frame as a line with an empty
stack (`` 1``): they count in the total, with no frame to rank.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = [
    "DEFAULT_TOP_FRAMES",
    "CollapsedStacks",
    "FrameTime",
    "parse_collapsed",
    "render_top_frames",
    "top_frames",
]

DEFAULT_TOP_FRAMES = 10
"""How many frames ``firstlight profile`` prints per process."""


@dataclass(frozen=True)
class CollapsedStacks:
    """One process's parsed collapsed stacks."""

    stacks: tuple[tuple[tuple[str, ...], int], ...]
    """(frames from the outermost to the innermost, samples) per line, in file order;
    the frames are empty for samples without a Python frame."""
    skipped_lines: tuple[int, ...] = ()
    """1-based numbers of the lines that did not parse (a file cut short when py-spy was
    stopped mid-write); blank lines are not counted."""

    @property
    def total_samples(self) -> int:
        """Samples over every stack: the denominator of each frame's share."""
        return sum(samples for _, samples in self.stacks)


@dataclass(frozen=True)
class FrameTime:
    """Where one frame's samples went."""

    frame: str
    """py-spy's frame text, ``function (file.py:line)``."""
    self_samples: int
    """Samples in which this frame was the innermost one (running its own code)."""
    total_samples: int
    """Samples in which this frame was anywhere on the stack (counted once per sample,
    even when it recurses)."""
    self_fraction: float
    """``self_samples`` over every sample of the process, in [0, 1]."""
    total_fraction: float
    """``total_samples`` over every sample of the process, in [0, 1]."""


def parse_collapsed(text: str) -> CollapsedStacks:
    """Parse collapsed stacks; a line without a positive integer count after its last
    space is skipped and its number kept in ``skipped_lines``. Never raises."""
    stacks: list[tuple[tuple[str, ...], int]] = []
    skipped: list[int] = []
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        frames = tuple(frame for frame in stack.split(";") if frame)
        if not count.isdigit() or int(count) == 0:
            skipped.append(number)
            continue
        stacks.append((frames, int(count)))
    return CollapsedStacks(tuple(stacks), tuple(skipped))


def top_frames(stacks: CollapsedStacks, limit: int = DEFAULT_TOP_FRAMES) -> tuple[FrameTime, ...]:
    """The ``limit`` frames with the most self time, most first (ties: more total time,
    then the frame's text, so the order is stable). Frames that were never innermost are
    left out: they spent no time of their own. Empty for a profile without samples."""
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    for frames, samples in stacks.stacks:
        if not frames:
            continue
        own[frames[-1]] += samples
        for frame in set(frames):
            anywhere[frame] += samples
    total = stacks.total_samples
    ranked = sorted(own, key=lambda frame: (-own[frame], -anywhere[frame], frame))
    return tuple(
        FrameTime(
            frame=frame,
            self_samples=own[frame],
            total_samples=anywhere[frame],
            self_fraction=own[frame] / total,
            total_fraction=anywhere[frame] / total,
        )
        for frame in ranked[: max(limit, 0)]
    )


def render_top_frames(frames: tuple[FrameTime, ...]) -> str:
    """``frames`` as a plain-text table (self %, total %, self samples, frame), one line
    per frame under a header; a note instead when there are none."""
    if not frames:
        return "  (no samples)"
    lines = ["   self%  total%  samples  frame"]
    lines.extend(
        f"  {f.self_fraction:6.1%}  {f.total_fraction:6.1%}  {f.self_samples:7d}  {f.frame}"
        for f in frames
    )
    return "\n".join(lines)
