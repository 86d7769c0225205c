"""``firstlight up`` as a user runs it: a subprocess that serves until interrupted."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from firstlight._ports import free_port
from tests.conftest import VENV_BIN

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def _config(tmp_path: Path, port: int, regions: list[dict[str, Any]], engine: str) -> Path:
    """A local config file: ``regions``, one model on ``engine``, the gateway on ``port``."""
    config = {
        "mode": "local",
        "regions": regions,
        "models": [{"name": "cli-model", "engine": engine, "resources": {"num_cpus": 0}}],
        "hints": {"key_prefix": f"fltest:cli{port}:"},
        "gateway": {"host": "127.0.0.1", "port": port},
        "cache_dir": str(tmp_path / "cache"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_up_serves_every_region_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    regions = [
        {"name": "cli-a", "peers": [{"region": "cli-b", "rtt_ms": 10}]},
        {"name": "cli-b", "peers": [{"region": "cli-a", "rtt_ms": 10}]},
    ]
    path = _config(tmp_path, port, regions, "vllm")
    command = [
        VENV_BIN / "firstlight",
        "up",
        "--config",
        path,
        "--engine",
        "sim",
        "--timeout",
        "300",
    ]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        printed = []
        for line in process.stdout:  # the endpoints, the examples, then the Ctrl-C hint
            printed.append(line)
            if "Press Ctrl-C to stop." in line:
                break
        text = "".join(printed)
        if "Press Ctrl-C to stop." not in text:  # it exited before serving: say why
            process.wait(timeout=60)
            pytest.fail(f"firstlight up exited {process.returncode}: {process.stderr.read()}")
        assert f"http://127.0.0.1:{port}/cli-a/v1" in text
        assert f"http://127.0.0.1:{port}/cli-b/v1" in text
        assert "curl -s" in text
        dashboard = f"http://127.0.0.1:{port}/cli-a/dashboard"
        assert dashboard in text
        page = httpx.get(dashboard, timeout=30)
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]
        assert "from openai import OpenAI" in text
        for region in ("cli-a", "cli-b"):
            with openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/{region}/v1", api_key="local"
            ) as client:
                reply = client.chat.completions.create(
                    model="cli-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3
                )
            assert reply.usage is not None
            assert reply.usage.completion_tokens == 3
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0
        errors = process.stderr.read()
    assert "Authentication is OFF" in errors
    assert "Stopping..." in errors


def test_a_ctrl_c_while_starting_stops_what_had_started(tmp_path: Path) -> None:
    """The hole: a Ctrl-C while Ray was starting was lost, and the platform went on to
    serve. Now it is taken at the next stage: `firstlight up` says so, stops Serve and
    its Ray cluster, and exits 130 (as a shell reports an interrupted command), leaving
    the gateway's port free."""
    port = free_port()
    path = _config(tmp_path, port, [{"name": "cli-c", "peers": []}], "sim")
    command = [VENV_BIN / "firstlight", "up", "--config", path, "--timeout", "300"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stderr is not None
        seen = []
        try:
            for line in process.stderr:  # interrupt while Ray starts, as a user would
                seen.append(line)
                if "starting a local Ray cluster" in line:
                    process.send_signal(signal.SIGINT)
                    break
            code = process.wait(timeout=120)
        finally:
            if process.poll() is None:  # the interrupt was lost: fail, not hang
                process.send_signal(signal.SIGINT)
                process.wait(timeout=120)
        rest = process.stderr.read()
        assert code == 130, "".join(seen) + rest
    assert "Stopped while starting" in rest
    with socket.socket() as sock:  # nothing of it still listens on the gateway's port
        sock.bind(("127.0.0.1", port))
