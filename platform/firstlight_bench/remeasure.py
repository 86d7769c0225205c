"""Re-measure some arms of a stored run: their points replace the stored ones, every other
arm's stay as they were measured.

A change to one arm's code (the ``firstlight`` arm's, usually) moves only that arm's
figures: the simulation is deterministic in virtual time, and every arm runs alone on
the same trace. Re-running the other nine arms of every suite entry would cost hours and
reproduce their stored points exactly. Called by
:func:`firstlight_bench.suite.run_suite` (``firstlight bench suite --arms``), after it
ran the named arms into a scratch folder with the stored entry's shape.

The merged ``results.json`` keeps the stored run's ``git_commit`` and command for the
arms it did not re-run, and lists each re-measure (arms, commit, command, time) under
``meta["remeasured"]``, which the page's table headings show.
"""

from __future__ import annotations

import filecmp
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from firstlight.errors import ConfigError, ConfigProblem

__all__ = ["merge_arms", "remeasured_note"]

_SHAPE_EXEMPT = frozenset({"arms"})
"""Config keys a re-measure may differ in (the arms it runs)."""


def merge_arms(stored_dir: Path, fresh_dir: Path, arms: Sequence[str]) -> dict[str, Any]:
    """The stored run in ``stored_dir`` with the points of ``arms`` taken from the run in
    ``fresh_dir`` (which ran only those arms, at the same seeds, loads and shape).

    Raises :class:`ConfigError` naming what differs when the two runs are not of one
    shape (seeds, loads, workload, or any setting of the cluster, the capacity included;
    a setting added since the stored run is taken at its default), or when the stored
    run has no point of one of ``arms``: re-run the entry whole then.
    """
    stored = json.loads((stored_dir / "results.json").read_text())
    fresh = json.loads((fresh_dir / "results.json").read_text())
    entry = stored_dir.name
    _check_shape(entry, stored["meta"], fresh["meta"])
    stored_arms = {p["arm"] for p in stored["points"]}
    missing = [a for a in arms if a not in stored_arms]
    if missing:
        raise ConfigError(
            [
                ConfigProblem(
                    "arms",
                    f"{entry}'s stored run has no {', '.join(missing)}: run the entry whole",
                    list(arms),
                    True,
                )
            ]
        )
    chosen = set(arms)
    points = [p for p in stored["points"] if p["arm"] not in chosen]
    points += [p for p in fresh["points"] if p["arm"] in chosen]
    meta = dict(stored["meta"])
    wall = {k: v for k, v in meta.get("wall_s", {}).items() if k.split("@")[0] not in chosen}
    wall.update(fresh["meta"].get("wall_s", {}))
    meta["wall_s"] = wall
    # A later re-measure of an arm supersedes an earlier one's record.
    earlier = [
        {**r, "arms": [a for a in r["arms"] if a not in chosen]} for r in meta.get("remeasured", [])
    ]
    meta["remeasured"] = [r for r in earlier if r["arms"]] + [
        {
            "arms": list(arms),
            "git_commit": fresh["meta"]["git_commit"],
            "command": fresh["meta"].get("command", ""),
            "created_at": fresh["meta"]["created_at"],
        }
    ]
    return {"meta": meta, "points": points}


def _differences(path: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """Where ``new`` departs from ``old``, key by key. A key the stored run lacks is a
    setting added since, at its default there, which the stored run had implicitly."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            difference
            for key in sorted(old)
            for difference in _differences(f"{path}.{key}", old[key], new.get(key))
        ]
    return [] if old == new else [(path, old, new)]


def _same_file(old: Any, new: Any) -> bool:
    """Whether two spellings of a trace's path (as typed, relative to where each run
    started) name files of the same bytes from here: a re-measure started elsewhere
    spells the stored trace differently."""
    if not (isinstance(old, str) and isinstance(new, str)):
        return False
    a, b = Path(old), Path(new)
    return a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False)


def _check_shape(entry: str, stored: dict[str, Any], fresh: dict[str, Any]) -> None:
    problems = []
    if stored.get("seeds") != fresh.get("seeds"):
        problems.append(("seeds", stored.get("seeds"), fresh.get("seeds")))
    problems += [
        (key, was, now)
        for key, was, now in _differences("workload", stored["workload"], fresh["workload"])
        if not (key == "workload.params.trace" and _same_file(was, now))
    ]
    old, new = stored["config"], fresh["config"]
    problems += _differences(
        "config",
        {k: v for k, v in old.items() if k not in _SHAPE_EXEMPT},
        {k: v for k, v in new.items() if k not in _SHAPE_EXEMPT},
    )
    if problems:
        raise ConfigError(
            [
                ConfigProblem(
                    key,
                    f"{entry}: the stored run has {was!r}, the re-measure {now!r}; "
                    "run the entry whole",
                    now,
                    True,
                )
                for key, was, now in problems
            ]
        )


def remeasured_note(meta: dict[str, Any], short: Any) -> str:
    """``; firstlight re-measured at `abc`` for a table heading (``short`` shortens a
    commit), or ``""`` when no arm was re-measured."""
    return "".join(
        f"; {', '.join(f'`{a}`' for a in r['arms'])} re-measured at `{short(str(r['git_commit']))}`"
        for r in meta.get("remeasured", [])
    )
