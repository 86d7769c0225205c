"""What the soak run reads of the running platform besides traced memory: the Serve
replica processes of its regions (from ``/proc``), their resident memory, and each
gateway's asyncio tasks (its ``/metrics``).

Called by :func:`firstlight_bench.tools.soak.soak` at every sample and before and after
the load; the gateways' traced memory is :mod:`firstlight_bench.tools.soak_memory`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

__all__ = ["asyncio_tasks", "gateway_pids", "idle_tasks", "rss_now"]

_TASKS_SERIES = "firstlight_gateway_asyncio_tasks"


def _processes(regions: Sequence[str]) -> dict[str, int]:
    """``<region>/<deployment>#<pid>`` → pid of every Serve replica of ``regions``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        prefix = "ray::ServeReplica:"
        if not title.startswith(prefix):
            continue
        app, _, deployment = title.removeprefix(prefix).partition(":")
        if app in regions:
            found[f"{app}/{deployment.split('.')[0]}#{entry.name}"] = int(entry.name)
    return found


def gateway_pids(region: str) -> dict[str, int]:
    """The gateway processes of ``region`` (process name → pid)."""
    prefix = f"{region}/gateway#"
    return {name: pid for name, pid in _processes([region]).items() if name.startswith(prefix)}


def _rss_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return None


def rss_now(regions: Sequence[str]) -> dict[str, float]:
    found = {process: _rss_mib(pid) for process, pid in _processes(regions).items()}
    return {process: rss for process, rss in found.items() if rss is not None}


async def asyncio_tasks(client: httpx.AsyncClient, endpoint: str) -> int:
    """The gateway's asyncio tasks (the scrape's own handling included, the same for
    every sample)."""
    text = (await client.get(f"{endpoint}/metrics")).text
    for line in text.splitlines():
        if line.startswith(_TASKS_SERIES):
            return int(float(line.rsplit(" ", 1)[1]))
    raise RuntimeError(f"{endpoint}/metrics has no {_TASKS_SERIES}")


async def idle_tasks(client: httpx.AsyncClient, endpoints: Mapping[str, str]) -> dict[str, int]:
    """Each gateway's fewest tasks over a few scrapes (background work comes and goes)."""
    counts: dict[str, int] = {}
    for _ in range(5):
        for region, url in endpoints.items():
            count = await asyncio_tasks(client, url)
            counts[region] = min(counts.get(region, count), count)
        await asyncio.sleep(0.2)
    return counts
