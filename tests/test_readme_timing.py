"""The README's timing section is the stored fresh-clone run (``python -m
tests.suite_timing``), rendered: no figure in it is typed by hand."""

from __future__ import annotations

import json

from tests.suite_timing import REPO, STORED, render_timing, shown_timing


def test_the_readme_shows_the_stored_fresh_clone_run() -> None:
    stored = json.loads(STORED.read_text())
    assert not stored["meta"]["git_commit"].endswith("-dirty")
    readme = (REPO / "README.md").read_text()
    assert shown_timing(readme) == render_timing(stored), (
        "README.md's timing section is stale: render it from the stored run"
    )
