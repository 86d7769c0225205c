"""Running a ``firstlight bench`` command in process, as its user types it."""

from __future__ import annotations

import sys
from unittest import mock

from typer.testing import CliRunner, Result

from firstlight.cli import app


def run_bench(*args: str) -> Result:
    """``firstlight bench ARGS...`` through the real CLI; ``sys.argv`` is what the
    console script would see (a stored report's meta records the command from it)."""
    argv = ["bench", *args]
    with mock.patch.object(sys, "argv", ["firstlight", *argv]):
        # Wide enough that an error box does not wrap the message a test looks for.
        return CliRunner().invoke(app, argv, env={"COLUMNS": "240", "TERMINAL_WIDTH": "240"})
