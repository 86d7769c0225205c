"""Where a benchmark's CPU went: cores used per group of processes over a window.

Who calls what: :mod:`firstlight_bench.tools.serving` takes a :func:`snapshot` before and after
each closed-loop level and stores :func:`cores_used` beside the level's requests/s, so
a report can say what limited the throughput (on a 2-core machine: usually the cores
themselves, shared by the clients, HAProxy, the gateways and the replicas).

Processes are grouped by their title (Ray names its replicas
``ray::ServeReplica:<app>:<deployment>``): :func:`group_of` is pure and tested.
Everything on the machine is counted, so the groups add up to the machine's busy time,
other tenants included (``other``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import psutil

__all__ = ["GROUPS", "cores_used", "group_of", "snapshot"]

GROUPS = (
    "clients",
    "haproxy",
    "gateways",
    "model replicas",
    "serve controller and proxy",
    "ray core",
    "redis",
    "other",
)
"""Every group :func:`group_of` returns, in the order reports show them."""


def group_of(title: str, name: str, command: str = "", *, is_client: bool = False) -> str:
    """The group of a process whose command line starts with ``title`` (Ray's replicas
    set it to their role) and is ``command`` in full, and whose executable's name is
    ``name``; ``is_client``: the benchmark's own process."""
    if is_client:
        return "clients"
    if name == "haproxy" or title.endswith("/haproxy") or title == "haproxy":
        return "haproxy"
    if title.startswith("ray::ServeReplica:"):
        deployment = title.removeprefix("ray::ServeReplica:").partition(":")[2]
        return "gateways" if deployment.startswith("gateway") else "model replicas"
    if title.startswith(("ray::ServeController", "ray::ProxyActor")):
        return "serve controller and proxy"
    if name.startswith("redis-server") or title.startswith("redis-server"):
        return "redis"
    # Ray's own: its named workers, its binaries, and its Python helpers (log monitor,
    # dashboard and runtime-env agents), whose interpreter comes first on the line.
    if title.startswith("ray::") or name in ("raylet", "gcs_server"):
        return "ray core"
    if "/ray/" in title or "/ray/" in command:
        return "ray core"
    return "other"


def snapshot() -> dict[int, tuple[str, float]]:
    """pid → (group, CPU seconds used so far, user + system) of every process visible."""
    me = os.getpid()
    seen: dict[int, tuple[str, float]] = {}
    for proc in psutil.process_iter(["name", "cmdline", "cpu_times"]):
        info = proc.info
        times = info.get("cpu_times")
        if times is None:
            continue
        cmdline = info.get("cmdline") or []
        title = cmdline[0] if cmdline else ""
        name = info.get("name") or ""
        group = group_of(title, name, " ".join(cmdline), is_client=proc.pid == me)
        seen[proc.pid] = (group, times.user + times.system)
    return seen


def cores_used(
    before: Mapping[int, tuple[str, float]],
    after: Mapping[int, tuple[str, float]],
    elapsed_s: float,
) -> dict[str, float]:
    """Cores (CPU seconds per second) each group used between two :func:`snapshot` s,
    ``elapsed_s`` apart; a process that started in between counts from zero, one that
    ended in between is not counted (its last seconds are lost, a small undercount), and
    one whose group changed (a reused pid, or a worker that took a role) is skipped
    rather than have its whole life counted in one window."""
    used = dict.fromkeys(GROUPS, 0.0)
    for pid, (group, cpu_s) in after.items():
        if pid in before and before[pid][0] != group:
            continue
        start_s = before[pid][1] if pid in before else 0.0
        used[group] += max(cpu_s - start_s, 0.0)
    return {g: round(s / elapsed_s, 3) for g, s in used.items()} if elapsed_s > 0 else used
