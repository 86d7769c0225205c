"""The telemetry benchmark runs and reports what it measured."""

from __future__ import annotations

import pytest

from firstlight_bench.telemetry import main, per_request_us, render_ms


def test_per_request_cost_is_measured_for_both_settings() -> None:
    cost = per_request_us(200, blocks=2)
    assert set(cost) == {"metrics_on", "metrics_off"}
    assert all(us > 0 for us in cost.values())


def test_render_covers_the_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    assert render_ms(3, repeats=2) > 0
    assert main(["--requests", "100", "--replicas", "2"]) == 0
    out = capsys.readouterr().out
    assert "/metrics render,   2 replicas" in out
