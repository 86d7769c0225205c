"""The built-in operator dashboard page, rendered by a real headless Chromium, offline.

A tiny threaded ``http.server`` on 127.0.0.1 serves the static page at
``/us-east/dashboard`` and a state fixture at ``/us-east/dashboard/api/state``; Chromium
loads the page with a virtual time budget and dumps the DOM after a few polls. The
state is a fixture, except for the advisor's test, which serves a real
:func:`~firstlight.dashboard.dashboard_state` of a telemetry that observed real prompts.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, FakeClock
from tests.dashboard.test_state import ADVISOR_GROUP, Gateway, variable_prefix_samples
from tests.telemetry.test_metrics import MODEL

PAGE = REPO_ROOT / "platform" / "firstlight" / "dashboard" / "static" / "index.html"
CHROMIUM = "/usr/bin/chromium"
PREFIX = "/us-east"
XSS = "<img src=x onerror=alert(1)>"

STATE: dict[str, Any] = {
    "region": "us-east",
    "generated_at": 1764480000.5,
    "window_s": 300,
    "gateways": ["0zx8kqtf", "9a1b2c3d"],
    "simulated": False,
    "regions": [
        {
            "name": "us-east",
            "local": True,
            "up": True,
            "rtt_ms": 0.0,
            "breaker": "closed",
            "summary_age_s": 0.0,
            "models": {"smollm2-135m": {"healthy_replicas": 2, "predicted_wait_ms": 12.5}},
        },
        {
            "name": "eu-west",
            "local": False,
            "up": True,
            "rtt_ms": 81.2,
            "breaker": "closed",
            "summary_age_s": 0.8,
            "models": {"smollm2-135m": {"healthy_replicas": 2, "predicted_wait_ms": 3.0}},
        },
    ],
    "models": [
        {
            "name": "smollm2-135m",
            "engine": "vllm",
            "simulated": False,
            "policy": "firstlight",
            "hints": {"status": "connected", "blocks": 1234},
            "ttft_ms": {"p50": 180.2, "p95": 410.0, "p99": 650.3, "count": 812},
            "itl_ms": {"p50": 21.0, "p95": 35.2, "p99": 48.9, "count": 790},
            "routes": {
                "local": 700,
                "spill_over": 90,
                "fail_over": 2,
                "from_peer": 20,
                "rejected": 0,
            },
            "requests_per_min": 162.4,
            "slo_ttft_p95_ms": 500.0,
            "replicas": [
                {
                    "id": "a1b2c3d4",
                    "queue_depth": 3,
                    "running": 2,
                    "waiting": 1,
                    "kv_cache_usage": 0.12,
                    "hit_ratio": 0.81,
                    "prefill_tokens_per_s": 5400.0,
                    "accepting": True,
                    "stats_age_s": 0.4,
                }
            ],
        }
    ],
    "decisions": [
        {
            "at": 1764479999.1,
            "model": "smollm2-135m",
            "route": "local",
            "region": "us-east",
            "replica": "a1b2c3d4",
            "predicted_ttft_ms": 150.3,
            "observed_ttft_ms": 171.0,
            "explanation": "a1b2c3d4: 150.3 ms = rtt 0.0 + wait 20.1 + prefill 120.2 "
            "(64 of 256 tokens cached) + overhead 10.0; runner-up b5e6: 190.0 ms",
        }
    ],
    "outlier_factor": 10.0,
    "trace_url": None,
    "outliers": [
        {
            "at": 1764479998.2,
            "model": "smollm2-135m",
            "kinds": ["ttft"],
            "factor": 10.0,
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
            "route": "local",
            "served_region": "us-east",
            "peer_region": None,
            "replica": "a1b2c3d4",
            "explanation": "a1b2c3d4: 150.3 ms = rtt 0.0 + wait 35.0 + prefill 110.0",
            "predicted_ttft_ms": 150.3,
            "ttft_ms": 2412.0,
            "dispatch_ttft_ms": 2400.5,
            "median_ttft_ms": 180.2,
            "e2e_ms": 2950.0,
            "median_e2e_ms": 900.0,
            "predicted_queue_wait_ms": 35.0,
            "replica_queue_len": 9,
            "cached_tokens": 64,
            "runner_up": "b5e6",
            "runner_up_ttft_ms": 190.0,
            "input_tokens": 256,
            "output_tokens": 40,
        }
    ],
    "advisor": [],
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, tuple[HTTPStatus, str, bytes]]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        status, content_type, body = self.server.routes.get(
            self.path.split("?", 1)[0], (HTTPStatus.NOT_FOUND, "text/plain", b"not found")
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.routes = {}
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def _serve(srv: _Server, state: dict[str, Any] | None) -> str:
    """Route the page and its state (or a 502 when ``state`` is None); return the page URL."""
    srv.routes[f"{PREFIX}/dashboard"] = (
        HTTPStatus.OK,
        "text/html; charset=utf-8",
        PAGE.read_bytes(),
    )
    srv.routes[f"{PREFIX}/dashboard/api/state"] = (
        (HTTPStatus.OK, "application/json", json.dumps(state).encode())
        if state is not None
        else (HTTPStatus.BAD_GATEWAY, "text/plain", b"upstream down")
    )
    host, port = srv.server_address[:2]
    return f"http://{host!s}:{port}{PREFIX}/dashboard"


def _dump_dom(url: str, profile: Path) -> str:
    if not Path(CHROMIUM).is_file():
        pytest.fail(
            f"the dashboard tests need headless Chromium at {CHROMIUM}; it is not installed"
        )
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "</html>" in done.stdout, done.stderr[-2000:]
    return done.stdout


def _element_text(dom: str, element_id: str) -> str:
    found = re.search(rf'<[a-z]+\b[^>]*\bid="{re.escape(element_id)}"[^>]*>([^<]*)<', dom)
    assert found, f"no element with id={element_id!r} in the DOM"
    return found.group(1)


def test_page_renders_regions_models_replicas_and_decisions(
    server: _Server, tmp_path: Path
) -> None:
    dom = _dump_dom(_serve(server, STATE), tmp_path / "profile")

    assert 'data-conn="ok"' in dom
    assert _element_text(dom, "region-name") == "us-east"
    assert _element_text(dom, "gateways") == "2 gateways"
    local, peer = dom.find('data-region="us-east"'), dom.find('data-region="eu-west"')
    assert 0 <= local < peer  # both cards, the local region first
    assert _element_text(dom, "ttft-p95-smollm2-135m") == "410"
    assert _element_text(dom, "ttft-p50-smollm2-135m") == "180"
    assert re.search(r'id="ttft-p95-smollm2-135m"[^>]*data-over-slo="false"', dom)
    assert _element_text(dom, "spill-rate-smollm2-135m") == "11.4%"  # 90 of 792
    assert 'data-replica="a1b2c3d4"' in dom
    assert STATE["decisions"][0]["explanation"] in dom
    assert _element_text(dom, "outlier-factor") == "10"
    outlier = re.search(r'<tr[^>]*data-outlier="0"[^>]*>(.*?)</tr>', dom, re.DOTALL)
    assert outlier
    assert 'data-kinds="ttft"' in outlier.group(0)
    assert 'data-trace="4bf92f3577b34da6a3ce929d0e0e4736"' in outlier.group(0)
    row = outlier.group(1)
    assert ">2,412 / 180<" in row  # TTFT against the median
    assert ">2,950 / 900<" in row
    for shown in (">35<", ">9<", ">64<", ">4bf92f3577b34da6a3ce929d0e0e4736<"):
        assert shown in row  # predicted wait, queue, cached tokens, trace id
    assert "us-east / a1b2c3d4" in row
    assert re.search(r'<div id="outliers-empty"[^>]*\bhidden\b', dom)
    empty = re.search(r'<div id="advisor-empty"([^>]*)>([^<]*)<', dom)
    assert empty
    assert "hidden" not in empty.group(1)
    assert empty.group(2) == "no requests served here yet"
    assert "data-advisor=" not in dom
    assert re.search(r'<span id="sim-badge"[^>]*\bhidden\b', dom)  # not simulated
    assert re.search(r'<div id="conn-banner"[^>]*\bhidden\b', dom)
    assert re.search(r'<div id="render-error"[^>]*\bhidden\b', dom)


def test_an_outliers_trace_id_links_to_the_configured_trace_viewer(
    server: _Server, tmp_path: Path
) -> None:
    state = copy.deepcopy(STATE)
    state["trace_url"] = "https://jaeger.example/trace/{trace_id}?uiEmbed=v0"
    dom = _dump_dom(_serve(server, state), tmp_path / "profile")
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    cell = re.search(r'<td class="trace" data-field="trace">(.*?)</td>', dom, re.DOTALL)
    assert cell
    link = re.fullmatch(r"<a ([^>]*)>([^<]*)</a>", cell.group(1))
    assert link, cell.group(1)
    assert f'href="https://jaeger.example/trace/{trace_id}?uiEmbed=v0"' in link.group(1)
    assert 'rel="noopener noreferrer"' in link.group(1)
    assert link.group(2) == trace_id


def test_data_is_escaped_not_interpreted(server: _Server, tmp_path: Path) -> None:
    state = copy.deepcopy(STATE)
    state["simulated"] = True
    state["decisions"][0]["explanation"] = f"winner {XSS} done"
    state["decisions"][0]["model"] = "<script>alert(2)</script>"
    state["outliers"][0]["explanation"] = f"slow {XSS} here"
    state["trace_url"] = "javascript:alert(3)//{trace_id}"  # not http(s): no link
    state["advisor"] = [
        {
            "group": XSS,
            "model": "smollm2-135m",
            "requests": 3,
            "prompt_tokens": 900,
            "cached_tokens": 0,
            "cached_share": 0.0,
            "shared_prefix_tokens_p50": 0,
            "prefill_ms_per_100_tokens": 20.0,
            "findings": [
                {
                    "kind": "evicted",
                    "requests": 2,
                    "tokens_per_request": 128.0,
                    "saving_ms_per_request": 25.6,
                    "advice": f"evicted {XSS} early",
                    "diverge_at_token": None,
                    "agree_from_token": None,
                }
            ],
        }
    ]

    dom = _dump_dom(_serve(server, state), tmp_path / "profile")

    assert "<img" not in dom.lower()
    assert "winner &lt;img src=x onerror=alert(1)&gt; done" in dom
    assert "slow &lt;img src=x onerror=alert(1)&gt; here" in dom
    assert "evicted &lt;img src=x onerror=alert(1)&gt; early" in dom
    assert "<script>alert(2)" not in dom
    assert "javascript:" not in dom
    assert ">4bf92f3577b34da6a3ce929d0e0e4736</td>" in dom  # the id as text
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in dom
    assert not re.search(r'<span id="sim-badge"[^>]*\bhidden\b', dom)  # simulated: shown


def _number(text: str) -> float:
    """A number as the page prints it ("1,234", "12.5")."""
    return float(text.replace(",", ""))


def test_page_renders_the_advisor_rows_of_a_real_state(server: _Server, tmp_path: Path) -> None:
    gateway = Gateway(FakeClock())
    try:
        for sample in variable_prefix_samples():
            gateway.telemetry.advisor.observe(sample)
        state = gateway.poll()
    finally:
        gateway.telemetry.shutdown()
    (row,) = state["advisor"]
    (finding,) = row["findings"]
    assert finding["kind"] == "variable_prefix"

    dom = _dump_dom(_serve(server, state), tmp_path / "profile")

    assert 'data-conn="ok"' in dom
    assert re.search(r'<div id="render-error"[^>]*\bhidden\b', dom)
    assert re.search(r'<div id="advisor-empty"[^>]*\bhidden\b', dom)
    found = re.search(
        rf'<tr[^>]*data-advisor="{re.escape(ADVISOR_GROUP)}/{re.escape(MODEL)}"[^>]*>(.*?)</tr>',
        dom,
        re.DOTALL,
    )
    assert found, "no advisor row for the group and model"
    cells = dict(re.findall(r'<td[^>]*data-field="([a-z]+)"[^>]*>([^<]*)<', found.group(1)))
    assert cells == {
        "group": ADVISOR_GROUP,
        "model": MODEL,
        "requests": "20",
        "cached": "0.0%",
        "shared": "0",
        "prefill": "50",
    }
    shown = re.search(
        r'<div[^>]*data-kind="variable_prefix"[^>]*>(.*?)</div></div>', found.group(1), re.DOTALL
    )
    assert shown, "the variable_prefix finding is not rendered"
    fields = dict(re.findall(r'data-field="([a-z]+)"[^>]*>([^<]*)<', shown.group(0)))
    assert fields["kind"] == "variable_prefix"
    assert _number(fields["tokens"]) == pytest.approx(finding["tokens_per_request"], abs=0.5)
    assert _number(fields["tokens"]) > 0
    assert _number(fields["saving"]) == pytest.approx(finding["saving_ms_per_request"], abs=0.5)
    assert fields["at"] == (
        f"diverges at token {finding['diverge_at_token']}, "
        f"agrees from token {finding['agree_from_token']}"
    )
    assert fields["advice"] == finding["advice"]
    assert not re.search(r'<div[^>]*data-field="at"[^>]*\bhidden\b', shown.group(0))
    assert re.search(r'<span[^>]*data-field="no-findings"[^>]*\bhidden\b', found.group(1))


def test_failed_poll_shows_the_disconnected_banner(server: _Server, tmp_path: Path) -> None:
    dom = _dump_dom(_serve(server, None), tmp_path / "profile")

    assert 'data-conn="down"' in dom
    banner = re.search(r'<div id="conn-banner"([^>]*)>([^<]*)<', dom)
    assert banner
    assert "hidden" not in banner.group(1)
    assert banner.group(2).startswith("disconnected — retrying")


def test_page_loads_nothing_from_the_network() -> None:
    html = PAGE.read_text(encoding="utf-8")
    without_comments = re.sub(r"<!--.*?-->", "", html, flags=re.DOTALL)
    assert not re.search(r"https?://", without_comments)
    for ref in re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", without_comments):
        assert ref.startswith("data:"), ref
    assert "@import" not in without_comments
    assert "url(" not in without_comments


def test_a_refused_state_says_an_operator_key_is_needed(server: _Server, tmp_path: Path) -> None:
    """With auth on the state answers only to an operator key: the page says so and
    shows a form for one (kept for the tab, sent as a Bearer token)."""
    url = _serve(server, None)
    refusal = json.dumps({"error": {"message": "no", "type": "authentication_error"}}).encode()
    server.routes[f"{PREFIX}/dashboard/api/state"] = (
        HTTPStatus.UNAUTHORIZED,
        "application/json",
        refusal,
    )
    dom = _dump_dom(url, tmp_path / "profile")
    banner = re.search(r'<div id="conn-banner"([^>]*)>([^<]*)<', dom)
    assert banner
    assert "hidden" not in banner.group(1)
    assert "an operator key is needed" in banner.group(2)
    assert '<form id="key-form">' in dom
    assert 'type="password"' in dom
