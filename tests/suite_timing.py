"""How long the README's commands take on a fresh clone, measured and stored.

``python -m tests.suite_timing --out docs/benchmarks/test-suite`` clones this checkout's
``HEAD`` (refused with uncommitted changes: the figures must belong to a commit) beside
it, then times, in the clone, what a newcomer runs: ``make bootstrap system-deps tools``
(the first run's installs), ``make test`` (lint and the whole suite) and ``make
test-fast`` (the edit loop). pytest's own report (JUnit XML) gives each test's time;
the slowest tests and test files are kept. It writes ``results.json`` and removes the
clone. The README's generated section is rendered from the stored file
(:func:`render_timing`), and ``tests/test_readme.py`` holds the README to it.

The clone sits beside the checkout (``--clone-dir``) so that the folders tests read
from beside the repository, where present, are found as CI finds them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as _platform
import resource
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).parents[1]
BEGIN = "<!-- test-timing:begin (generated from docs/benchmarks/test-suite/results.json; do not edit) -->"
END = "<!-- test-timing:end -->"
STORED = REPO / "docs" / "benchmarks" / "test-suite" / "results.json"
_STEPS = (
    ("bootstrap", ["make", "bootstrap", "system-deps", "tools"], None),
    ("make test", ["make", "test"], "full.xml"),
    ("make test-fast", ["make", "test-fast"], "fast.xml"),
)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def _module_of(classname: str) -> str:
    """The test module of a JUnit ``classname`` (a test class's name dropped)."""
    parts = classname.split(".")
    while len(parts) > 1 and parts[-1].startswith("Test"):
        parts.pop()
    return ".".join(parts)


def _junit(path: Path) -> dict[str, Any]:
    """Counts, pytest's own time, and the slowest tests and files, from JUnit XML."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    pytest_s = 0.0
    for suite in suites:
        for key in counts:
            counts[key] += int(suite.get(key, 0))
        pytest_s += float(suite.get("time", 0.0))
    cases = []
    by_file: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        seconds = float(case.get("time", 0.0))
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        cases.append((seconds, name))
        by_file[_module_of(str(case.get("classname", "")))] += seconds
    cases.sort(reverse=True)
    files = sorted(by_file.items(), key=lambda item: -item[1])
    return {
        **counts,
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        "pytest_s": round(pytest_s, 1),
        "slowest_tests": [{"test": n, "s": round(s, 1)} for s, n in cases[:8]],
        "slowest_files": [{"file": f, "s": round(s, 1)} for f, s in files[:8]],
    }


def measure(clone_dir: Path) -> dict[str, Any]:
    """Clone ``HEAD`` into ``clone_dir`` and time each step there (see the module
    docstring). Raises ``SystemExit`` with the reason when the checkout is dirty or a
    step fails (its output is left in the clone for reading)."""
    if _git("status", "--porcelain"):
        raise SystemExit("uncommitted changes: commit first, the figures name a commit")
    commit = _git("rev-parse", "HEAD")
    if clone_dir.exists():
        shutil.rmtree(clone_dir)
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone_dir)], check=True)
    steps = []
    disk: dict[str, int] = {}
    for name, command, junit in _STEPS:
        env = dict(os.environ)
        if junit:
            # xunit1: the suite's tests record properties, which xunit2 refuses.
            env["PYTEST_ADDOPTS"] = f"--junitxml={clone_dir / junit} -o junit_family=xunit1"
        log = clone_dir / f"{name.replace(' ', '-')}.log"
        started = time.monotonic()
        with log.open("w") as out:
            done = subprocess.run(command, cwd=clone_dir, env=env, stdout=out, stderr=out)
        wall_s = round(time.monotonic() - started, 1)
        print(f"{name}: {wall_s} s, exit {done.returncode}", file=sys.stderr)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed (exit {done.returncode}); see {log}")
        step: dict[str, Any] = {"step": name, "command": " ".join(command), "wall_s": wall_s}
        if junit:
            step["pytest"] = _junit(clone_dir / junit)
        steps.append(step)
        if name == "bootstrap":
            disk = {d: _du_mib(clone_dir / d) for d in (".venv", ".venv-tools")}
    largest_rss_mib = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    shutil.rmtree(clone_dir)
    return {
        "disk_mib": disk,
        "largest_process_rss_mib": largest_rss_mib,
        "meta": {
            "git_commit": commit,
            "command": "python -m tests.suite_timing --out docs/benchmarks/test-suite",
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "python": _platform.python_version(),
            "shared_folder_beside": (clone_dir.parent / "shared").is_dir(),
        },
        "steps": steps,
    }


def _du_mib(path: Path) -> int:
    """Disk used under ``path`` in MiB (``du``'s count of allocated blocks)."""
    done = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True)
    return round(int(done.stdout.split()[0]) / 1024) if done.returncode == 0 else 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or "unknown"


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def render_timing(data: dict[str, Any]) -> str:
    """The README's generated section from a stored ``results.json``."""
    meta = data["meta"]
    lines = [
        BEGIN,
        "",
        f"Measured by `{meta['command']}` on a fresh clone of `{meta['git_commit'][:12]}` "
        f"({meta['cores']} cores, {meta['cpu']}, Python {meta['python']}; pip's cache warm "
        "and PyTorch's CPU wheel local, so add the downloads, about 4 GB, elsewhere):",
        "",
        "| step | wall time | pytest | tests |",
        "|---|---:|---:|---|",
    ]
    for step in data["steps"]:
        report = step.get("pytest")
        tests = (
            f"{report['passed']:,} passed, {report['skipped']} skipped, "
            f"{report['failures'] + report['errors']} failed"
            if report
            else "—"
        )
        pytest_s = _minutes(report["pytest_s"]) if report else "—"
        lines.append(f"| `{step['command']}` | {_minutes(step['wall_s'])} | {pytest_s} | {tests} |")
    full = next(s for s in data["steps"] if s["step"] == "make test")["pytest"]
    disk = data.get("disk_mib", {})
    lines += [
        "",
        f"Disk after the bootstrap: `.venv` {disk.get('.venv', 0) / 1024:.1f} GiB, "
        f"`.venv-tools` {disk.get('.venv-tools', 0) / 1024:.1f} GiB. The largest single "
        f"process of the run peaked at {data.get('largest_process_rss_mib', 0) / 1024:.1f} "
        "GiB resident.",
        "",
        "The slowest test files of `make test`: "
        + ", ".join(f"`{f['file']}` {_minutes(f['s'])}" for f in full["slowest_files"][:5])
        + ".",
        "",
        END,
    ]
    return "\n".join(lines)


def shown_timing(readme: str) -> str:
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    return readme[start:end]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="Folder of results.json.")
    parser.add_argument(
        "--clone-dir", type=Path, default=REPO.parent / "firstlight-suite-timing",
        help="Where the fresh clone goes (removed afterwards).",
    )  # fmt: skip
    parser.add_argument(
        "--page", type=Path, default=None,
        help="Rewrite this page's generated section from the result (README.md).",
    )  # fmt: skip
    args = parser.parse_args()
    data = measure(args.clone_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"stored {args.out / 'results.json'}", file=sys.stderr)
    if args.page is not None:
        page = args.page.read_text()
        args.page.write_text(page.replace(shown_timing(page), render_timing(data)))


if __name__ == "__main__":
    main()
