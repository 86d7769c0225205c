"""The mutation run's stored score on the development page (:mod:`tests.mutation`), and
how it counts."""

from __future__ import annotations

import json
from pathlib import Path

from tests.mutation import BEGIN, END, STORED, render_mutation, score, shown_mutation

PAGE = Path(__file__).parents[1] / "docs" / "development.md"


def _group(**counts: int) -> dict[str, object]:
    base = {
        "group": "g",
        "mutants": 100,
        "in_signatures": 10,
        "killed": 0,
        "survived": 0,
        "incompetent": 0,
        "timeout": 0,
    }
    return {**base, **counts}


def test_the_page_shows_the_stored_mutation_run() -> None:
    data = json.loads(STORED.read_text())
    assert shown_mutation(PAGE.read_text()) == render_mutation(data), (
        "docs/development.md is stale: paste render_mutation() of the stored results"
    )


def test_timeouts_and_incompetent_mutants_count_as_killed_and_survivors_do_not() -> None:
    assert score(_group(killed=6, survived=2, incompetent=1, timeout=1)) == 0.8
    assert score(_group()) is None


def test_the_table_sums_the_groups() -> None:
    data = {
        "meta": {
            "command": "make mutation",
            "git_commit": "abcdef0123456789",
            "cosmic_ray": "8.7.0",
            "seed": 0,
        },
        "groups": [
            {**_group(killed=9, survived=1), "group": "routing", "mutants": 4000},
            {**_group(killed=4, timeout=1), "group": "prefix", "mutants": 192},
        ],
    }
    section = render_mutation(data)
    assert section.startswith(BEGIN)
    assert section.endswith(END)
    assert "| routing | 4,000 | 10 | 10 | 9 | 1 | 90.0 % |" in section
    assert "| prefix | 192 | 10 | 5 | 5 | 0 | 100.0 % |" in section
    assert "| **all** | 4,192 | 20 | 15 | 14 | 1 | **93.3 %** |" in section
