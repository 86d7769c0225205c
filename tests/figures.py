"""A pytest plugin that stores what fault tests measured: ``--figures-out FILE`` writes,
per test that ran, its outcome, duration and the figures it recorded with pytest's
``record_property(name, value)``, as JSON.

Registered for the whole tree by the root ``conftest.py``; without the option it does
nothing. ``firstlight bench faults`` (:mod:`firstlight_bench.tools.faults`) runs the fault tests
with it and builds the stored report and the tables of ``docs/reliability.md`` from that
file, so the doc's figures are the tests' own measurements, never copied by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--figures-out",
        type=Path,
        default=None,
        help="write each test's outcome and recorded figures (record_property) as JSON",
    )


def pytest_configure(config: pytest.Config) -> None:
    out: Path | None = config.getoption("--figures-out")
    # Under pytest-xdist the controller receives every worker's reports, figures included,
    # and writes the one file; a worker would write its own share to the same path.
    if out is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Figures(out), "firstlight-figures")


class _Figures:
    """Collects the records while the session runs and writes them at its end."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.records: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The call phase's outcome and figures (a failed setup is stored as an error)."""
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.records.append(
                {
                    "nodeid": report.nodeid,
                    "outcome": report.outcome if report.when == "call" else "error",
                    "duration_s": round(report.duration, 1),
                    "figures": {str(name): value for name, value in report.user_properties},
                }
            )

    def pytest_sessionfinish(self) -> None:
        self.out.write_text(json.dumps({"tests": self.records}, indent=2) + "\n")
