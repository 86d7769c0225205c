"""``firstlight profile`` without Ray: collapsed stacks parsed and ranked (table-driven),
py-spy's failures in one line, a region's replicas picked out of Ray's actor table, the
CLI's argument errors — and py-spy itself on a plain Python process of this machine."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from firstlight.cli import app
from firstlight.profile import (
    CollapsedStacks,
    FrameTime,
    ProfileOptions,
    ProfilingError,
    ReplicaProcess,
    default_out_dir,
    parse_collapsed,
    render_top_frames,
    top_frames,
)
from firstlight.profile.record import pyspy_command, pyspy_problem, record_processes
from firstlight.profile.replicas import replica_processes
from tests.conftest import REPO_ROOT

LOCAL = REPO_ROOT / "examples" / "local-two-regions.yaml"
MAIN = "<module> (app.py:9)"
LOOP = "run (loop.py:12)"
WORK = "work (app.py:3)"

PARSE_CASES = [
    # (collapsed text, expected stacks, expected skipped line numbers)
    ("", (), ()),
    ("\n\n", (), ()),
    (f"{MAIN};{WORK} 7\n", (((MAIN, WORK), 7),), ()),
    (f"{MAIN} 1\n{MAIN};{WORK} 2", (((MAIN,), 1), ((MAIN, WORK), 2)), ()),
    # Frames hold spaces: the count is after the last one.
    ("f (a b.py:1);g (c.py:2) 3", ((("f (a b.py:1)", "g (c.py:2)"), 3),), ()),
    # Windows line ends and trailing blanks.
    (f"{MAIN} 4\r\n", (((MAIN,), 4),), ()),
    # A file cut short, no count, a zero count: skipped, numbered.
    (f"{MAIN} 2\n{MAIN};wo", (((MAIN,), 2),), (2,)),
    ("no-count-here", (), (1,)),
    (f"{MAIN} 0", (), (1,)),
    (f"{MAIN} -3\n{MAIN} 1.5", (), (1, 2)),
    # Samples of a thread without a Python frame (py-spy writes " 1"): no frame, counted.
    (f" 5\n{MAIN} 1", (((), 5), ((MAIN,), 1)), ()),
    # Empty frames from doubled separators are dropped, not kept as "".
    (f"{MAIN};;{WORK} 1", (((MAIN, WORK), 1),), ()),
]


@pytest.mark.parametrize(("text", "stacks", "skipped"), PARSE_CASES)
def test_collapsed_stacks_parse(
    text: str, stacks: tuple[tuple[tuple[str, ...], int], ...], skipped: tuple[int, ...]
) -> None:
    parsed = parse_collapsed(text)
    assert parsed.stacks == stacks
    assert parsed.skipped_lines == skipped
    assert parsed.total_samples == sum(n for _, n in stacks)


def _frame(frame: str, own: int, anywhere: int, total: int) -> FrameTime:
    return FrameTime(frame, own, anywhere, own / total, anywhere / total)


TOP_CASES = [
    # (collapsed text, limit, expected (frame, self, total) in order)
    ("", 10, []),
    (f"{MAIN} 5", 10, [(MAIN, 5, 5)]),
    # Self time goes to the innermost frame; callers only gain total time.
    (
        f"{MAIN};{WORK} 6\n{MAIN};{LOOP} 3\n{MAIN} 1",
        10,
        [(WORK, 6, 6), (LOOP, 3, 3), (MAIN, 1, 10)],
    ),
    # The same frame at the leaf of several stacks adds up.
    (f"{MAIN};{WORK} 2\n{LOOP};{WORK} 3\n{LOOP} 4", 10, [(WORK, 5, 5), (LOOP, 4, 7)]),
    # Recursion counts once per sample in total time.
    (f"{MAIN};{WORK};{WORK} 4", 10, [(WORK, 4, 4)]),
    # Ties: more total time first, then the frame's text.
    (f"{MAIN};b 2\n{MAIN};a 2\n{LOOP};{MAIN};c 2", 10, [("a", 2, 2), ("b", 2, 2), ("c", 2, 2)]),
    (f"{LOOP} 2\n{MAIN};{LOOP};x 1\n{WORK} 2", 10, [(LOOP, 2, 3), (WORK, 2, 2), ("x", 1, 1)]),
    # The limit keeps the first ones; a limit of 0 keeps none.
    ("a 5\nb 4\nc 3\nd 2", 2, [("a", 5, 5), ("b", 4, 4)]),
    ("a 5", 0, []),
    # Samples without a frame count in the shares, not in the ranking.
    (f" 2\n{MAIN};{WORK} 2", 10, [(WORK, 2, 2)]),
]


@pytest.mark.parametrize(("text", "limit", "expected"), TOP_CASES)
def test_top_frames_rank_self_time(
    text: str, limit: int, expected: list[tuple[str, int, int]]
) -> None:
    stacks = parse_collapsed(text)
    total = stacks.total_samples
    assert top_frames(stacks, limit) == tuple(
        _frame(frame, own, anywhere, total) for frame, own, anywhere in expected
    )


def test_top_frames_default_to_ten() -> None:
    stacks = parse_collapsed("\n".join(f"f{i} {100 - i}" for i in range(15)))
    assert [f.frame for f in top_frames(stacks)] == [f"f{i}" for i in range(10)]


def test_top_frames_render_as_a_table_with_shares() -> None:
    stacks = parse_collapsed(f"{MAIN};{WORK} 3\n{MAIN} 1")
    assert render_top_frames(top_frames(stacks)).splitlines() == [
        "   self%  total%  samples  frame",
        f"   75.0%   75.0%        3  {WORK}",
        f"   25.0%  100.0%        1  {MAIN}",
    ]
    assert render_top_frames(top_frames(CollapsedStacks(()))) == "  (no samples)"


PROBLEM_CASES = [
    # (return code, stderr, expected note)
    (0, "py-spy> Wrote flamegraph data to 'x.svg'. Samples: 44 Errors: 0\n", None),
    (0, "py-spy> Stopped sampling because process exited\n", None),
    (None, "", "py-spy did not finish within 32 s and was stopped"),
    (
        1,
        "Error: Failed to get process executable name. Check that the process is running.\n\n"
        "Caused by:\n    0: No such file or directory (os error 2)\n",
        "process 42 is gone (it exited before py-spy could attach)",
    ),
    (
        1,
        "Error: Permission denied (os error 13)\n",
        "py-spy may not attach to process 42 (ptrace not permitted): run as its user or root; "
        "in a container add the SYS_PTRACE capability",
    ),
    (
        1,
        "Error: Failed to find python version from target process\n",
        "py-spy failed: Error: Failed to find python version from target process",
    ),
    (1, "something odd\nlast words\npy-spy> Sampling process\n", "py-spy failed: last words"),
    (3, "", "py-spy failed: exit code 3"),
]


@pytest.mark.parametrize(("returncode", "stderr", "expected"), PROBLEM_CASES)
def test_pyspy_failures_become_one_line(
    returncode: int | None, stderr: str, expected: str | None
) -> None:
    assert pyspy_problem(returncode, stderr, 42, 32.0) == expected


def test_pyspy_records_without_pausing_the_process() -> None:
    options = ProfileOptions(seconds=3, rate_hz=50)
    command = pyspy_command("py-spy", 7, Path("o/x.svg"), "flamegraph", options)
    assert command == [
        "py-spy", "record", "--pid", "7", "--duration", "3", "--rate", "50",
        "--format", "flamegraph", "--output", "o/x.svg", "--nonblocking",
    ]  # fmt: skip
    both = ProfileOptions(seconds=3, idle=True, subprocesses=True)
    assert pyspy_command("py-spy", 7, Path("x"), "raw", both)[-3:] == [
        "--nonblocking",
        "--idle",
        "--subprocesses",
    ]


@pytest.mark.parametrize(
    ("seconds", "rate_hz", "message"),
    [
        (0, 100, "seconds = 0: record for at least 1 second"),
        (1, 0, "rate_hz = 0: must be between 1 and 1000"),
        (1, 1001, "rate_hz = 1001: must be between 1 and 1000"),
    ],
)
def test_options_out_of_bounds_are_refused_with_the_value(
    seconds: int, rate_hz: int, message: str
) -> None:
    with pytest.raises(ProfilingError, match=f"^{message}$"):
        ProfileOptions(seconds=seconds, rate_hz=rate_hz)


def _actor(name: str, *, pid: int = 100, state: str = "ALIVE", node: str = "n1") -> dict[str, Any]:
    return {
        "Name": name,
        "State": state,
        "Pid": pid,
        "Address": {"NodeID": node, "IPAddress": "10.0.0.7"},
    }


def test_the_region_s_live_replicas_are_picked_out_of_the_actor_table() -> None:
    actors = [
        _actor("SERVE_REPLICA::east#model-m#b2", pid=12),
        _actor("SERVE_REPLICA::east#gateway#z9", pid=10),
        _actor("SERVE_REPLICA::east#model-m#a1", pid=11, node="n2"),
        _actor("SERVE_REPLICA::east#model-m#dead", pid=13, state="DEAD"),
        _actor("SERVE_REPLICA::east#model-m#pending", pid=0, state="ALIVE"),
        _actor("SERVE_REPLICA::east-2#gateway#x", pid=14),  # another region, same prefix
        _actor("SERVE_REPLICA::west#gateway#y", pid=15),
        _actor("SERVE_CONTROLLER_ACTOR", pid=16),
        _actor("", pid=17),
    ]
    found = replica_processes(actors, "east", local_node_id="n1")
    assert found == (
        ReplicaProcess("gateway", "z9", 10, "10.0.0.7", local=True),
        ReplicaProcess("model-m", "a1", 11, "10.0.0.7", local=False),
        ReplicaProcess("model-m", "b2", 12, "10.0.0.7", local=True),
    )
    assert [p.label for p in found] == ["gateway#z9", "model-m#a1", "model-m#b2"]


@pytest.mark.parametrize(
    ("deployment", "replica_id", "stem"),
    [
        ("gateway", "abc123", "gateway-abc123"),
        ("model-Qwen2.5-7B", "x1", "model-Qwen2.5-7B-x1"),
        ("model-a/b", "r:1", "model-a_b-r_1"),
    ],
)
def test_file_names_are_safe(deployment: str, replica_id: str, stem: str) -> None:
    assert ReplicaProcess(deployment, replica_id, 1).file_stem == stem


def test_the_default_folder_names_the_region_and_the_utc_time() -> None:
    assert default_out_dir("us-east", 0.0) == Path("profiles/us-east-19700101T000000Z")


runner = CliRunner()


def test_cli_without_a_region_says_how_to_give_one() -> None:
    result = runner.invoke(app, ["profile", "--seconds", "1"])
    assert result.exit_code == 2
    assert "region: pass --region or set region" in result.stderr


def test_cli_refuses_a_region_the_config_does_not_have() -> None:
    result = runner.invoke(app, ["profile", "--config", str(LOCAL), "--region", "mars"])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: unknown region 'mars'; regions of {LOCAL}: us-east, eu-west"
    )


BUSY = """
import sys
import time

def spin():
    end = time.monotonic() + 0.05
    while time.monotonic() < end:
        pass

def main():
    stop = time.monotonic() + float(sys.argv[2]) if len(sys.argv) > 2 else float("inf")
    while time.monotonic() < stop:
        spin()

main()
"""


def test_pyspy_records_busy_processes_and_says_which_exited_or_were_gone(
    tmp_path: Path,
) -> None:
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    busy = subprocess.Popen([sys.executable, str(script)])
    short = subprocess.Popen([sys.executable, str(script), "--exit-after", "1.5"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        time.sleep(0.5)  # past the interpreters' start-up
        profiles = record_processes(
            [
                ReplicaProcess("gateway", "busy", busy.pid),
                ReplicaProcess("model-m", "short", short.pid),
                ReplicaProcess("model-m", "gone", gone.pid),
            ],
            tmp_path,
            ProfileOptions(seconds=3),
        )
    finally:
        for process in (busy, short):
            process.kill()
            process.wait()
    recorded, exited, missing = profiles
    assert exited.notes == ("the process exited during the recording: the profile ends there",)
    assert exited.flamegraph is not None
    assert exited.stacks.total_samples > 0
    assert recorded.notes == ()
    assert recorded.flamegraph == tmp_path / "gateway-busy.svg"
    assert recorded.flamegraph.read_text().lstrip().startswith(("<?xml", "<svg"))
    assert recorded.collapsed == tmp_path / "gateway-busy.collapsed.txt"
    assert recorded.stacks.total_samples > 0
    assert "spin (busy.py" in recorded.top[0].frame
    assert not missing.recorded
    assert missing.notes == (f"process {gone.pid} is gone (it exited before py-spy could attach)",)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "busy.py",
        "gateway-busy.collapsed.txt",
        "gateway-busy.svg",
        "model-m-short.collapsed.txt",
        "model-m-short.svg",
    ]
