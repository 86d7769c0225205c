"""``firstlight profile`` on the session's real Ray cluster: every replica process of a
running sim region (its gateway and each model replica) gets a flame graph, collapsed
stacks and top frames; a region that does not run is one line and exit 1."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from firstlight.cli import app
from firstlight.profile import ProfileOptions, profile_region
from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from tests.serve.cluster import platform_config, sim_model

REGION = "prof-a"


@pytest.fixture(scope="module")
def region(serve_port: int) -> Iterator[LocalPlatform]:
    config = platform_config(serve_port, [{"name": REGION}], [sim_model("prof-sim", replicas=2)])
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


@pytest.mark.slow
def test_every_replica_process_gets_a_flame_graph_and_top_frames(
    region: LocalPlatform, tmp_path: Path
) -> None:
    # --idle: an unloaded replica waits all the time, and waiting threads are samples too.
    result = profile_region(REGION, tmp_path, ProfileOptions(seconds=2, idle=True))
    deployments = [item.process.deployment for item in result.processes]
    assert deployments == ["gateway", "model-prof-sim", "model-prof-sim"]
    assert len({item.process.pid for item in result.processes}) == 3
    for item in result.processes:
        assert item.notes == (), item.process.label
        assert item.flamegraph is not None
        assert item.flamegraph.stat().st_size > 0
        assert item.flamegraph.read_text().lstrip().startswith(("<?xml", "<svg"))
        assert item.collapsed is not None
        assert item.stacks.total_samples > 0
        assert item.top, item.process.label
        assert item.top[0].self_samples > 0


def test_a_region_that_does_not_run_is_one_line_and_exit_1(region: LocalPlatform) -> None:
    result = CliRunner().invoke(app, ["profile", "--region", "no-such-region", "--seconds", "1"])
    assert result.exit_code == 1
    message = result.stderr.strip()
    assert re.fullmatch(
        r"error: region 'no-such-region' is not running in the Ray cluster at \S+:\d+ "
        r"\(Serve applications running: [^)]*\); pass --address for another one",
        message,
    ), message
    assert REGION in message
