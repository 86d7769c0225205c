"""The suite-timing tool's reading of pytest's report and its README section
(:mod:`tests.suite_timing`); the measurement itself is a fresh clone's whole run, made by
hand and stored."""

from __future__ import annotations

from pathlib import Path

from tests.suite_timing import BEGIN, END, _junit, render_timing, shown_timing

_JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="2" tests="6" time="125.5">
<testcase classname="tests.bench.test_des" name="test_a" time="40.0"/>
<testcase classname="tests.bench.test_des" name="test_b" time="20.0"/>
<testcase classname="tests.serve.test_regions.TestRegions" name="test_c" time="50.0"><failure message="x"/></testcase>
<testcase classname="tests.test_prefix" name="test_d" time="0.5"/>
<testcase classname="tests.test_prefix" name="test_e" time="0.0"><skipped message="absent"/></testcase>
<testcase classname="tests.test_prefix" name="test_f" time="0.0"><skipped message="absent"/></testcase>
</testsuite></testsuites>
"""


def test_pytests_report_gives_counts_and_the_slowest_tests_and_files(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(_JUNIT)
    report = _junit(path)
    assert (report["tests"], report["passed"], report["failures"], report["skipped"]) == (
        6,
        3,
        1,
        2,
    )
    assert report["pytest_s"] == 125.5
    assert report["slowest_tests"][0] == {
        "test": "tests.serve.test_regions.TestRegions::test_c",
        "s": 50.0,
    }
    assert [f["file"] for f in report["slowest_files"][:2]] == [
        "tests.bench.test_des",  # 60 s over two tests beats one test of 50 s
        "tests.serve.test_regions",
    ]


def test_the_readme_section_shows_each_step_from_the_stored_file(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(_JUNIT)
    report = _junit(path)
    data = {
        "disk_mib": {".venv": 4608, ".venv-tools": 512},
        "largest_process_rss_mib": 3277,
        "meta": {
            "git_commit": "0123456789abcdef",
            "command": "python -m tests.suite_timing --out docs/benchmarks/test-suite",
            "cpu": "Some CPU",
            "cores": 2,
            "python": "3.11.9",
        },
        "steps": [
            {"step": "bootstrap", "command": "make bootstrap", "wall_s": 61.0},
            {"step": "make test", "command": "make test", "wall_s": 1999.6, "pytest": report},
        ],
    }
    section = render_timing(data)
    assert section.startswith(BEGIN)
    assert section.endswith(END)
    assert "fresh clone of `0123456789ab`" in section
    assert "| `make bootstrap` | 1 min 01 s | — | — |" in section
    assert "| `make test` | 33 min 20 s | 2 min 06 s | 3 passed, 2 skipped, 1 failed |" in section
    assert "`tests.bench.test_des` 1 min 00 s" in section
    assert "`.venv` 4.5 GiB, `.venv-tools` 0.5 GiB" in section
    assert "peaked at 3.2 GiB resident" in section
    assert shown_timing(f"intro\n{section}\noutro") == section
