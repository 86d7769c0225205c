"""Re-measuring some arms of a stored suite run (``firstlight bench suite --arms``): the
named arms' points are replaced, every other arm's stay exactly as stored, and a run of
another shape is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from firstlight.errors import ConfigError
from firstlight_bench.remeasure import merge_arms
from firstlight_bench.suite import render_tables, run_suite

_SMALL = {"requests": 40, "seeds": (0,), "loads": (0.5,), "jobs": 1}


def _points(folder: Path) -> dict[tuple[str, float, int], dict[str, object]]:
    data = json.loads((folder / "results.json").read_text())
    return {(p["arm"], p["load"], p["seed"]): p for p in data["points"]}


def _without_wall_clock(point: dict[str, object]) -> dict[str, object]:
    # decision_us is measured in wall clock; everything else is virtual and deterministic.
    return {k: v for k, v in point.items() if k != "decision_us"}


def test_a_remeasure_replaces_the_named_arm_and_keeps_the_others(tmp_path: Path) -> None:
    run_suite(out=tmp_path, only=["w3"], **_SMALL)  # type: ignore[arg-type]
    folder = tmp_path / "w3"
    before = _points(folder)
    # Mark the stored points: a merge that re-ran or dropped them would lose the marks.
    data = json.loads((folder / "results.json").read_text())
    for p in data["points"]:
        p["imbalance"] = 99.0
    (folder / "results.json").write_text(json.dumps(data))

    run_suite(out=tmp_path, only=["w3"], arms=["firstlight"], **_SMALL)  # type: ignore[arg-type]

    after = _points(folder)
    assert after.keys() == before.keys(), "the same arms, loads and seeds"
    for key, point in after.items():
        if key[0] == "firstlight":
            assert point["imbalance"] != 99.0, "re-measured"
            assert _without_wall_clock(point) == _without_wall_clock(before[key])
        else:
            assert point["imbalance"] == 99.0, f"{key} was re-run or dropped"
    meta = json.loads((folder / "results.json").read_text())["meta"]
    assert [r["arms"] for r in meta["remeasured"]] == [["firstlight"]]
    assert {k.split("@")[0] for k in meta["wall_s"]} == {key[0] for key in after}
    assert "`firstlight` re-measured at `" in render_tables(tmp_path)


def test_a_second_remeasure_of_an_arm_supersedes_the_first(tmp_path: Path) -> None:
    run_suite(out=tmp_path, only=["w3"], **_SMALL)  # type: ignore[arg-type]
    run_suite(out=tmp_path, only=["w3"], arms=["firstlight", "random"], **_SMALL)  # type: ignore[arg-type]
    run_suite(out=tmp_path, only=["w3"], arms=["firstlight"], **_SMALL)  # type: ignore[arg-type]
    meta = json.loads((tmp_path / "w3" / "results.json").read_text())["meta"]
    assert [r["arms"] for r in meta["remeasured"]] == [["random"], ["firstlight"]]


def test_a_stored_run_of_another_shape_is_refused_naming_what_differs(tmp_path: Path) -> None:
    run_suite(out=tmp_path / "stored", only=["w3"], **_SMALL)  # type: ignore[arg-type]
    run_suite(out=tmp_path / "fresh", only=["w3"], **{**_SMALL, "seeds": (1,)})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="seeds"):
        merge_arms(tmp_path / "stored" / "w3", tmp_path / "fresh" / "w3", ["firstlight"])
    fresh = tmp_path / "fresh" / "w3" / "results.json"
    data = json.loads(fresh.read_text())
    data["meta"]["seeds"] = [0]
    data["meta"]["config"]["kv_cache_blocks"] += 1
    fresh.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"config\.kv_cache_blocks"):
        merge_arms(tmp_path / "stored" / "w3", tmp_path / "fresh" / "w3", ["firstlight"])


def test_an_arm_the_stored_run_lacks_or_nobody_knows_is_refused(tmp_path: Path) -> None:
    run_suite(out=tmp_path, only=["w3"], **_SMALL)  # type: ignore[arg-type]
    copy = tmp_path / "copy" / "w3"
    shutil.copytree(tmp_path / "w3", copy)
    data = json.loads((copy / "results.json").read_text())
    data["points"] = [p for p in data["points"] if p["arm"] != "random"]
    (copy / "results.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="has no random"):
        merge_arms(copy, tmp_path / "w3", ["random"])
    with pytest.raises(ConfigError, match="unknown fastest"):
        run_suite(out=tmp_path, only=["w3"], arms=["fastest"], **_SMALL)  # type: ignore[arg-type]


def test_a_setting_added_since_the_stored_run_is_taken_at_its_default(tmp_path: Path) -> None:
    run_suite(out=tmp_path / "stored", only=["w3"], **_SMALL)  # type: ignore[arg-type]
    run_suite(out=tmp_path / "fresh", only=["w3"], **_SMALL)  # type: ignore[arg-type]
    stored = tmp_path / "stored" / "w3" / "results.json"
    data = json.loads(stored.read_text())
    data["meta"]["workload"]["params"].pop("vocab_size")  # as if it predated the setting
    data["meta"]["config"].pop("gateways")
    stored.write_text(json.dumps(data))
    merged = merge_arms(tmp_path / "stored" / "w3", tmp_path / "fresh" / "w3", ["firstlight"])
    assert [r["arms"] for r in merged["meta"]["remeasured"]] == [["firstlight"]]
    data["meta"]["workload"]["params"]["max_output_tokens"] += 1  # a setting that differs
    stored.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"workload\.params\.max_output_tokens"):
        merge_arms(tmp_path / "stored" / "w3", tmp_path / "fresh" / "w3", ["firstlight"])


def test_a_trace_is_the_same_by_its_bytes_whatever_the_path_spelling(tmp_path: Path) -> None:
    """A re-measure started from another folder spells the stored trace's path another
    way: the same bytes are the same trace; other bytes are refused naming the path."""
    run_suite(out=tmp_path / "stored", only=["w3"], **_SMALL)  # type: ignore[arg-type]
    run_suite(out=tmp_path / "fresh", only=["w3"], **_SMALL)  # type: ignore[arg-type]
    trace, same, other = tmp_path / "a.jsonl", tmp_path / "copy" / "a.jsonl", tmp_path / "b.jsonl"
    same.parent.mkdir()
    for path, text in ((trace, "{}\n"), (same, "{}\n"), (other, "[]\n")):
        path.write_text(text)

    def merged_with(stored_path: Path, fresh_path: Path) -> None:
        for run, path in (("stored", stored_path), ("fresh", fresh_path)):
            results = tmp_path / run / "w3" / "results.json"
            data = json.loads(results.read_text())
            data["meta"]["workload"]["params"]["trace"] = str(path)
            results.write_text(json.dumps(data))
        merge_arms(tmp_path / "stored" / "w3", tmp_path / "fresh" / "w3", ["firstlight"])

    merged_with(trace, same)
    with pytest.raises(ConfigError, match=r"workload\.params\.trace"):
        merged_with(trace, other)
    with pytest.raises(ConfigError, match=r"workload\.params\.trace"):
        merged_with(tmp_path / "gone.jsonl", same)
