"""Record a region's processes with py-spy: a flame graph and collapsed stacks each.

:func:`profile_region` is what ``firstlight profile`` calls: it finds the region's replica
processes (:mod:`firstlight.profile.replicas`), runs two ``py-spy record`` per process at
once (``--format flamegraph`` and ``--format raw``, both ``--nonblocking`` so the replica
is never paused) as asyncio subprocesses with a deadline, then reads each collapsed file
and ranks its frames (:mod:`firstlight.profile.stacks`). A process that exits meanwhile
keeps what was recorded until then; one that is gone before py-spy attaches, or that py-spy
may not attach to, gets a one-line reason instead of files.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from firstlight.profile.errors import ProfilingError
from firstlight.profile.replicas import ReplicaProcess, find_replica_processes
from firstlight.profile.stacks import (
    DEFAULT_TOP_FRAMES,
    CollapsedStacks,
    FrameTime,
    parse_collapsed,
    top_frames,
)

__all__ = [
    "ProcessProfile",
    "ProfileOptions",
    "RegionProfile",
    "default_out_dir",
    "profile_region",
    "pyspy_binary",
    "pyspy_command",
    "pyspy_problem",
    "record_processes",
]

GRACE_S = 30.0
"""How long py-spy may take beyond the recording itself (attaching to a large process,
reading its symbols, writing the SVG) before it is stopped."""
_EXITED = "Stopped sampling because process exited"


@dataclass(frozen=True)
class ProfileOptions:
    """How to record; the CLI's options map onto it one to one."""

    seconds: int
    """How long to sample each process, >= 1."""
    rate_hz: int = 100
    """Samples per second."""
    idle: bool = False
    """Also sample threads that wait (py-spy's ``--idle``): the picture of wall time, not
    only of CPU time. An idle replica has no samples without it."""
    subprocesses: bool = False
    """Also sample the replica's child processes (py-spy's ``--subprocesses``): a vLLM
    replica's engine core runs in one."""
    top: int = DEFAULT_TOP_FRAMES
    """How many frames to rank per process."""

    def __post_init__(self) -> None:
        if self.seconds < 1:
            raise ProfilingError(f"seconds = {self.seconds}: record for at least 1 second")
        if not 1 <= self.rate_hz <= 1000:
            raise ProfilingError(f"rate_hz = {self.rate_hz}: must be between 1 and 1000")


@dataclass(frozen=True)
class ProcessProfile:
    """What was recorded for one process."""

    process: ReplicaProcess
    flamegraph: Path | None
    """The SVG flame graph; ``None`` when py-spy wrote none (``notes`` says why)."""
    collapsed: Path | None
    """The collapsed stacks (py-spy's raw format); ``None`` when py-spy wrote none."""
    stacks: CollapsedStacks = field(default_factory=lambda: CollapsedStacks(()))
    top: tuple[FrameTime, ...] = ()
    """The frames with the most self time, most first."""
    notes: tuple[str, ...] = ()
    """One line each: a file missing and why, the process exiting meanwhile, no samples."""

    @property
    def recorded(self) -> bool:
        """Whether any file was written for the process."""
        return self.flamegraph is not None or self.collapsed is not None


@dataclass(frozen=True)
class RegionProfile:
    """The result of :func:`profile_region`."""

    region: str
    out_dir: Path
    options: ProfileOptions
    processes: tuple[ProcessProfile, ...]


def default_out_dir(region: str, now_s: float | None = None) -> Path:
    """``profiles/<region>-<UTC time>`` under the current folder."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s))
    return Path("profiles") / f"{region}-{stamp}"


def pyspy_binary() -> str:
    """The py-spy executable: the one installed beside this Python (a virtual
    environment's ``bin``, which need not be on ``PATH``), else the one on ``PATH``.
    Raises :class:`ProfilingError` when there is none."""
    beside = Path(sysconfig.get_path("scripts")) / "py-spy"
    if beside.is_file():
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise ProfilingError("py-spy is not installed here: pip install py-spy")
    return found


def pyspy_command(
    binary: str, pid: int, output: Path, output_format: str, options: ProfileOptions
) -> list[str]:
    """The ``py-spy record`` command line for one process and one output format."""
    command = [
        binary,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(options.seconds),
        "--rate",
        str(options.rate_hz),
        "--format",
        output_format,
        "--output",
        str(output),
        "--nonblocking",
    ]
    if options.idle:
        command.append("--idle")
    if options.subprocesses:
        command.append("--subprocesses")
    return command


def pyspy_problem(returncode: int | None, output: str, pid: int, deadline_s: float) -> str | None:
    """Why a ``py-spy record`` run produced nothing usable, in one line, from its exit
    code and its output (stdout and stderr); ``None`` when it succeeded. ``returncode``
    is ``None`` when it was stopped at its deadline."""
    if returncode is None:
        return f"py-spy did not finish within {deadline_s:.0f} s and was stopped"
    if returncode == 0:
        return None
    lowered = output.lower()
    if "failed to get process executable name" in lowered or "no such process" in lowered:
        return f"process {pid} is gone (it exited before py-spy could attach)"
    if "permission denied" in lowered or "operation not permitted" in lowered:
        return (
            f"py-spy may not attach to process {pid} (ptrace not permitted): run as its user "
            "or root; in a container add the SYS_PTRACE capability"
        )
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    others = [line for line in lines if not line.startswith("py-spy>")]
    if errors:
        detail = errors[0]
    elif others:
        detail = others[-1]
    else:
        detail = f"exit code {returncode}"
    return f"py-spy failed: {detail}"


@dataclass(frozen=True)
class _Run:
    returncode: int | None
    output: str
    """stdout and stderr, interleaved."""


async def _run(command: Sequence[str], deadline_s: float) -> _Run:
    """Run ``command``, collecting its output; kill it at ``deadline_s``."""
    env = {**os.environ, "RUST_BACKTRACE": "0"}  # py-spy's errors in one line, not a trace
    # py-spy says on stdout that the process exited, its errors on stderr: read both.
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    try:
        async with asyncio.timeout(deadline_s):
            output, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return _Run(None, "")
    except asyncio.CancelledError:
        proc.kill()
        await proc.wait()
        raise
    return _Run(proc.returncode, output.decode("utf-8", "replace"))


@dataclass(frozen=True)
class _Recorded:
    process: ReplicaProcess
    flamegraph: Path
    collapsed: Path
    flamegraph_run: _Run
    collapsed_run: _Run


async def _record_one(
    process: ReplicaProcess, out_dir: Path, options: ProfileOptions, binary: str
) -> _Recorded:
    deadline_s = options.seconds + GRACE_S
    svg = out_dir / f"{process.file_stem}.svg"
    raw = out_dir / f"{process.file_stem}.collapsed.txt"
    svg_run, raw_run = await asyncio.gather(
        _run(pyspy_command(binary, process.pid, svg, "flamegraph", options), deadline_s),
        _run(pyspy_command(binary, process.pid, raw, "raw", options), deadline_s),
    )
    return _Recorded(process, svg, raw, svg_run, raw_run)


def record_processes(
    processes: Sequence[ReplicaProcess], out_dir: Path, options: ProfileOptions
) -> tuple[ProcessProfile, ...]:
    """Record every process of ``processes`` at once into ``out_dir`` (which must exist):
    ``<deployment>-<replica id>.svg`` and ``.collapsed.txt`` each, then read and rank the
    stacks. Blocks for about ``options.seconds`` (it runs its own event loop: not to be
    called from a running one). Processes on another node are not recorded (their
    profile says so). Raises :class:`ProfilingError` when py-spy is not installed; a
    process's own failure is in its profile's ``notes``."""
    binary = pyspy_binary()
    local = [p for p in processes if p.local]
    recorded = asyncio.run(_record_all(local, out_dir, options, binary))
    by_pid = {r.process.pid: r for r in recorded}
    return tuple(_read(by_pid[p.pid], options) if p.local else _elsewhere(p) for p in processes)


async def _record_all(
    processes: Sequence[ReplicaProcess], out_dir: Path, options: ProfileOptions, binary: str
) -> list[_Recorded]:
    return list(
        await asyncio.gather(*(_record_one(p, out_dir, options, binary) for p in processes))
    )


def _elsewhere(process: ReplicaProcess) -> ProcessProfile:
    note = (
        f"runs on another node ({process.node_ip or 'unknown address'}): run py-spy there "
        "(see Profiling in docs/troubleshooting.md)"
    )
    return ProcessProfile(process, None, None, notes=(note,))


def _read(recorded: _Recorded, options: ProfileOptions) -> ProcessProfile:
    """The profile of one recorded process: its files when written, its collapsed stacks
    parsed and ranked, and a note for every problem."""
    pid = recorded.process.pid
    deadline_s = options.seconds + GRACE_S
    problems: dict[str, str] = {}
    files: list[Path | None] = []
    for kind, path, run in (
        ("flame graph", recorded.flamegraph, recorded.flamegraph_run),
        ("collapsed stacks", recorded.collapsed, recorded.collapsed_run),
    ):
        problem = pyspy_problem(run.returncode, run.output, pid, deadline_s)
        if problem is None and not path.is_file():
            problem = "py-spy wrote no file"
        files.append(path if problem is None else None)
        if problem is not None:
            problems[kind] = problem
            path.unlink(missing_ok=True)  # a file cut short would mislead
    flamegraph, collapsed = files
    if len(set(problems.values())) == 1 and len(problems) == 2:
        notes = list(problems.values())[:1]  # one cause (the process is gone): said once
    else:
        notes = [f"{kind}: {problem}" for kind, problem in problems.items()]
    if any(_EXITED in run.output for run in (recorded.flamegraph_run, recorded.collapsed_run)):
        notes.append("the process exited during the recording: the profile ends there")
    stacks = CollapsedStacks(())
    if collapsed is not None:
        stacks = parse_collapsed(collapsed.read_text(encoding="utf-8", errors="replace"))
        if stacks.total_samples == 0:
            hint = "" if options.idle else " (pass --idle to include waiting threads)"
            notes.append(f"no samples: the process ran no Python code{hint}")
        if stacks.skipped_lines:
            notes.append(f"{len(stacks.skipped_lines)} unreadable line(s) in {collapsed.name}")
    return ProcessProfile(
        recorded.process,
        flamegraph,
        collapsed,
        stacks,
        top_frames(stacks, options.top),
        tuple(notes),
    )


def profile_region(
    region: str, out_dir: Path, options: ProfileOptions, *, address: str = "auto"
) -> RegionProfile:
    """Profile every replica process of ``region`` (gateway and model replicas) in the
    Ray cluster at ``address`` for ``options.seconds`` and write the files to ``out_dir``
    (created). Called by ``firstlight profile`` and the tests; blocks for about
    ``options.seconds`` (must not be called from a running event loop).

    Raises :class:`ProfilingError` when no cluster answers, the region does not run there
    or has no live replica on this node, py-spy is missing, or ``out_dir`` cannot be
    created. Replicas on other nodes are listed, not recorded (py-spy attaches locally).
    """
    pyspy_binary()  # before connecting to Ray: a missing py-spy is the first thing to say
    processes = find_replica_processes(region, address=address)
    if not any(p.local for p in processes):
        nodes = ", ".join(sorted({p.node_ip or "unknown" for p in processes}))
        raise ProfilingError(
            f"no replica of region {region!r} runs on this node (they run on {nodes}): "
            "run firstlight profile there"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProfilingError(f"cannot create {out_dir}: {exc.strerror}") from exc
    profiles = record_processes(processes, out_dir, options)
    return RegionProfile(region, out_dir, options, profiles)
