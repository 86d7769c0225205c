"""The telemetry benchmark runs and reports what it measured.

The costs are timed with ``time.perf_counter``; here a clock that moves only when a
request finishes or ``/metrics`` renders stands in for it, by a known amount, so what
the benchmark reports can be checked exactly (per request, in µs or ms, metrics on
and off not swapped) without timing anything."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from firstlight.telemetry import GatewayTelemetry
from firstlight.telemetry.metrics import RequestObservation
from firstlight_bench.tools import telemetry as bench
from firstlight_bench.tools.telemetry import per_request_us, render_ms
from tests.bench.bench_cli import run_bench

FINISH_COST_S = {True: 3e-6, False: 1e-6}
"""What one finished request costs on the stand-in clock, metrics on and off."""
RENDER_COST_S = 0.5e-3


class _Ticking(GatewayTelemetry):
    """The real telemetry, advancing ``clock`` by a set amount per finished request (and
    per render), counting the requests that were recorded whole."""

    clock: ClassVar[float] = 0.0
    recorded: ClassVar[dict[bool, int]] = {}
    rendered: ClassVar[list[str]] = []

    def finish(self, obs: RequestObservation) -> None:
        super().finish(obs)
        whole = (
            obs.route == "local"
            and obs.first_token_at is not None
            and (obs.input_tokens, obs.output_tokens) == (256, 32)
        )
        if whole:
            _Ticking.recorded[self.enabled] = _Ticking.recorded.get(self.enabled, 0) + 1
        _Ticking.clock += FINISH_COST_S[self.enabled]

    def render(self) -> tuple[bytes, str]:
        body, content_type = super().render()
        _Ticking.rendered.append(body.decode())
        _Ticking.clock += RENDER_COST_S
        return body, content_type


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> type[_Ticking]:
    monkeypatch.setattr(_Ticking, "clock", 0.0)
    monkeypatch.setattr(_Ticking, "recorded", {})
    monkeypatch.setattr(_Ticking, "rendered", [])
    monkeypatch.setattr(bench, "GatewayTelemetry", _Ticking)
    fake_time = SimpleNamespace(perf_counter=lambda: _Ticking.clock, time=time.time)
    monkeypatch.setattr(bench, "time", fake_time)
    return _Ticking


def test_per_request_cost_is_the_time_per_recorded_request_in_us(
    ticking: type[_Ticking],
) -> None:
    cost = per_request_us(200, blocks=4)
    assert cost == {
        "metrics_on": pytest.approx(3.0, rel=1e-6),
        "metrics_off": pytest.approx(1.0, rel=1e-6),
    }
    # A warm-up block and 4 measured ones of 200 / 4 = 50 requests, for each setting,
    # each request recorded whole (route, first token, tokens).
    assert ticking.recorded == {True: 250, False: 250}


def test_render_is_timed_per_render_in_ms_and_covers_the_replicas(
    ticking: type[_Ticking],
) -> None:
    assert render_ms(3, repeats=2) == pytest.approx(0.5, rel=1e-6)
    assert ticking.recorded == {True: 100}  # the requests recorded before rendering
    assert len(ticking.rendered) == 2
    for body in ticking.rendered:
        for replica in ("replica-000", "replica-001", "replica-002"):
            assert f'replica="{replica}"' in body
        assert 'replica="replica-003"' not in body


def test_the_command_reports_both_settings_and_each_replica_count() -> None:
    result = run_bench("telemetry", "--requests", "100", "--replicas", "2,5")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "/metrics render,   2 replicas" in out
    assert "/metrics render,   5 replicas" in out
    report: dict[str, Any] = json.loads(out[out.index("{") :])
    assert set(report["per_request_us"]) == {"metrics_on", "metrics_off"}
    assert set(report["render_ms"]) == {"2", "5"}
    # The table prints the numbers the JSON holds.
    cost = report["per_request_us"]
    assert f"metrics on {cost['metrics_on']:.1f} µs, off {cost['metrics_off']:.1f} µs" in out
    assert f"5 replicas: {report['render_ms']['5']:.2f} ms" in out
    assert report["meta"]["command"] == "firstlight bench telemetry --requests 100 --replicas 2,5"


def test_a_run_stores_its_report_and_rewrites_the_page(tmp_path: Path) -> None:
    begin, end = bench.markers("run")
    page = tmp_path / "page.md"
    page.write_text(f"before\n{begin}\nold\n{end}\nafter\n")
    out = tmp_path / "run"
    result = run_bench("telemetry", "--requests", "100", "--replicas", "1", "--out", str(out),
                       "--page", str(page))  # fmt: skip
    assert result.exit_code == 0, result.output
    stored = json.loads((out / "results.json").read_text())
    assert json.loads(result.stdout[result.stdout.index("{") :]) == stored
    assert page.read_text() == f"before\n{bench.render_markdown(stored, 'run')}\nafter\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "'--requests'"),
        (["--replicas", "2,x"], "--replicas"),
        (["--replicas", "2,-1"], "each at least 0"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("telemetry", *argv)
    assert result.exit_code == 2
    assert message in result.stderr
