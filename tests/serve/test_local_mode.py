"""Start-up that tells: a taken gateway port is refused by name before Ray starts, a Redis
that does not answer turns hints off with the reason, and,
on the session's real Ray cluster, a region whose model folder does not exist makes
``start_local`` stop at the replica's first failed start — long before Serve's retries end
or the readiness time-out — with the engine's own error and where the logs are."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from firstlight.config import GatewayConfig, parse_config
from firstlight.serve.local_mode import StartupError, _check_port, ensure_redis, start_local
from tests.serve.cluster import platform_config


def test_a_gateway_port_in_use_is_refused_by_field_and_value() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(StartupError) as info:
            _check_port(GatewayConfig(host="127.0.0.1", port=port))
    assert str(info.value).startswith(f"gateway.port: {port} on 127.0.0.1 is not available")
    _check_port(GatewayConfig(host="127.0.0.1", port=port))  # free again once closed


def test_a_port_held_by_a_leftover_process_names_it(tmp_path: Path) -> None:
    """A killed `firstlight up` can leave Ray's HAProxy holding the gateway's port: the
    next start names the process (pid and command line), so the user need not hunt it."""
    script = tmp_path / "leftover-listener.py"
    script.write_text(
        "import socket, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True)\n"
        "sys.stdin.read()\n"  # hold the port until the test closes stdin
    )
    with subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdin is not None
        port = int(holder.stdout.readline())
        try:
            with pytest.raises(StartupError) as info:
                _check_port(GatewayConfig(host="127.0.0.1", port=port))
        finally:
            holder.stdin.close()
    message = str(info.value)
    assert f"process {holder.pid} holds it" in message
    assert "leftover-listener" in message
    assert f"kill {holder.pid}" in message


def test_a_remote_redis_that_does_not_answer_turns_hints_off_and_says_why() -> None:
    # 192.0.2.0/24 is reserved for documentation: nothing answers there.
    config = parse_config({"hints": {"redis_url": "redis://192.0.2.1:6379/0"}}, "test")
    reports: list[str] = []
    enabled, note = ensure_redis(config, reports.append)
    assert not enabled
    assert note == (
        "hints: OFF - nothing answers at redis://192.0.2.1:6379/0 and it is not local, so it "
        "is not started here; routing uses queue depth only"
    )
    assert reports == []  # nothing was started


@pytest.mark.slow
def test_a_missing_model_folder_stops_start_up_with_the_engine_error_and_the_logs(
    serve_port: int, tmp_path: Path
) -> None:
    from ray import serve

    missing = tmp_path / "no-such-model"
    config = platform_config(
        serve_port,
        [{"name": "broken-a"}],
        [
            {
                "name": "broken-model",
                "engine": "vllm",
                "source": str(missing),
                "resources": {"num_cpus": 0},
            }
        ],
    )
    reports: list[str] = []
    try:
        with pytest.raises(StartupError) as info:
            start_local(config, report=reports.append, timeout_s=120)
    finally:
        serve.delete("broken-a")
    message = str(info.value)
    # It stops at the first failed start (``failure.retrying`` below), not at the
    # deadline: a timeout's error carries no failures and no engine error.
    assert "start-up stops here" in message
    # The engine's (or the gateway's tokenizer's) own words, with the folder it looked in.
    assert "ModelNotFoundError" in message
    assert str(missing) in message
    assert "region broken-a, deployment " in message
    failure = info.value.failures[0]
    assert failure.region == "broken-a"
    assert failure.retrying  # the first failed start, not Serve's DEPLOY_FAILED verdict
    # Where the logs are: the session's folder, Serve's per-replica file, the process's output.
    logs = info.value.logs
    assert logs is not None
    assert logs.serve_dir.is_dir()
    assert f"Full logs: {logs.logs_dir}" in message
    assert f"{logs.serve_dir}/replica_broken-a_{failure.deployment}_*.log" in message
    assert failure.worker_log is not None
    assert failure.worker_log.is_file()
    assert str(failure.worker_log) in message
    # Progress came first, each stage with its time.
    assert any(r.startswith("deploying 1 region(s): broken-a") for r in reports), reports
    assert any(r.startswith("a replica failed to start, ") for r in reports), reports
