"""The soak run: steady load for minutes on a local two-region platform, watching for
what only time shows — lost requests, memory growth, leaked asyncio tasks.

``python -m firstlight_bench.soak --minutes 10`` deploys two emulated regions on the
``sim`` engine (results are labelled simulated), runs closed-loop
:class:`~firstlight_bench.steady.SteadyLoad` clients against both, and every
``--sample-s`` seconds reads the resident memory of every gateway and model replica
process (``/proc``; Ray names its processes ``ray::ServeReplica:<app>:<deployment>``)
and each gateway's ``firstlight_gateway_asyncio_tasks``. It prints one line per sample
and a markdown table at the end, and with ``--out`` writes the numbers as JSON.

Memory growth is measured from the first sample under load (after ``--warmup-s``, when
caches and pools have filled) to the last; asyncio tasks are compared idle before the
load and idle after it, so a task per request that never ends shows as a difference.
Tests call :func:`soak` with a platform of their own for a short run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from firstlight.config import PlatformConfig, parse_config
from firstlight.telemetry.rolling import percentile
from firstlight_bench.steady import Answer, SteadyLoad

__all__ = ["SoakReport", "main", "soak", "soak_config"]

Report = Callable[[str], None]
_TASKS_SERIES = "firstlight_gateway_asyncio_tasks"


@dataclass
class SoakReport:
    """What a soak run measured (times in seconds, memory in MiB)."""

    duration_s: float
    clients_per_region: int
    requests: int = 0
    lost: int = 0
    hung: int = 0
    ttft_ms_first_minute: dict[str, float | None] = field(default_factory=dict)
    ttft_ms_last_minute: dict[str, float | None] = field(default_factory=dict)
    rss_mib: dict[str, list[float]] = field(default_factory=dict)
    """Process (``<region>/<deployment>#<pid>``) → RSS at each sample under load."""
    sample_at_s: list[float] = field(default_factory=list)
    tasks_idle_before: dict[str, int] = field(default_factory=dict)
    tasks_idle_after: dict[str, int] = field(default_factory=dict)
    tasks_under_load: dict[str, list[int]] = field(default_factory=dict)
    hint_blocks: dict[str, list[int]] = field(default_factory=dict)
    """Region → (replica, block) entries in its gateway's hint mirror at each sample:
    state that grows with distinct prompts until the replicas' caches evict or the hints
    expire (``hints.ttl_s``)."""
    problems: dict[str, int] = field(default_factory=dict)

    def growth_pct(self, process: str) -> float:
        """RSS growth of ``process`` from the first sample under load to the last."""
        first, last = self.rss_mib[process][0], self.rss_mib[process][-1]
        return (last - first) / first * 100.0

    def markdown(self) -> str:
        """The report as the table ``docs/reliability.md`` quotes."""
        lines = [
            f"soak: {self.duration_s / 60:.1f} min, {self.clients_per_region} closed-loop "
            f"clients per region, sim engine (simulated): {self.requests} requests, "
            f"{self.lost} lost, {self.hung} hung",
            "",
            "| process | RSS first sample under load (MiB) | RSS last (MiB) | growth |",
            "|---|---|---|---|",
        ]
        for process, samples in sorted(self.rss_mib.items()):
            lines.append(
                f"| {process} | {samples[0]:.0f} | {samples[-1]:.0f} | "
                f"{self.growth_pct(process):+.1f} % |"
            )
        lines += [
            "",
            "| gateway | asyncio tasks idle before | under load (min to max) | idle after |",
        ]
        lines.append("|---|---|---|---|")
        for region in sorted(self.tasks_idle_before):
            loaded = self.tasks_under_load.get(region) or [0]
            lines.append(
                f"| {region} | {self.tasks_idle_before[region]} | {min(loaded)} to {max(loaded)} "
                f"| {self.tasks_idle_after.get(region, -1)} |"
            )
        lines.append("")
        for region, blocks in sorted(self.hint_blocks.items()):
            lines.append(
                f"hint mirror of {region}: {blocks[0]} entries at the first sample, "
                f"{max(blocks)} at most, {blocks[-1]} at the last"
            )
        for region in sorted(self.ttft_ms_first_minute):
            first = _ms(self.ttft_ms_first_minute[region])
            last = _ms(self.ttft_ms_last_minute.get(region))
            lines.append(f"TTFT p99 in {region}: first minute {first}, last {last}")
        return "\n".join(lines)


def soak_config(port: int) -> PlatformConfig:
    """The soak run's platform: two regions 40 ms apart, ``sim`` replicas with the
    default model's CPU costs, its own Redis key prefix."""
    model = {"name": "sim-soak", "engine": "sim", "max_model_len": 4096,
             "resources": {"num_cpus": 0}}  # fmt: skip
    return parse_config(
        {
            "mode": "local",
            "regions": [
                {"name": "soak-east", "peers": [{"region": "soak-west", "rtt_ms": 40}]},
                {"name": "soak-west", "peers": [{"region": "soak-east", "rtt_ms": 40}]},
            ],
            "models": [{**model, "replicas": 2}],
            "hints": {"key_prefix": f"firstlight:soak:{uuid.uuid4().hex[:8]}:"},
            "gateway": {"host": "127.0.0.1", "port": port},
        },
        "soak run",
    )


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


def _rss_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return None


async def _tasks(client: httpx.AsyncClient, endpoint: str) -> int:
    """The gateway's asyncio tasks (the scrape's own handling included, the same for
    every sample)."""
    text = (await client.get(f"{endpoint}/metrics")).text
    for line in text.splitlines():
        if line.startswith(_TASKS_SERIES):
            return int(float(line.rsplit(" ", 1)[1]))
    raise RuntimeError(f"{endpoint}/metrics has no {_TASKS_SERIES}")


async def _idle_tasks(client: httpx.AsyncClient, endpoints: Mapping[str, str]) -> dict[str, int]:
    """Each gateway's fewest tasks over a few scrapes (background work comes and goes)."""
    counts: dict[str, int] = {}
    for _ in range(5):
        for region, url in endpoints.items():
            count = await _tasks(client, url)
            counts[region] = min(counts.get(region, count), count)
        await asyncio.sleep(0.2)
    return counts


async def soak(
    endpoints: Mapping[str, str],
    model: str,
    duration_s: float,
    *,
    clients: int = 3,
    sample_s: float = 30.0,
    warmup_s: float = 30.0,
    report: Report = print,
) -> SoakReport:
    """Load every region of ``endpoints`` for ``duration_s`` and measure (see the
    module docstring). Needs the platform's processes on this machine."""
    result = SoakReport(duration_s, clients)
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        result.tasks_idle_before = await _idle_tasks(client, endpoints)
        loads = {
            region: SteadyLoad(url, model, clients=clients, max_tokens=16, prompt_words=60)
            for region, url in endpoints.items()
        }
        for load in loads.values():
            load.start()
        started = time.monotonic()
        next_sample = started + min(warmup_s, duration_s)
        while (now := time.monotonic()) < started + duration_s:
            await asyncio.sleep(max(min(next_sample, started + duration_s) - now, 0.0))
            if time.monotonic() < next_sample:
                continue
            next_sample += sample_s
            await _sample(result, client, endpoints, time.monotonic() - started)
            served = sum(len(load.answers) for load in loads.values())
            report(f"  {result.sample_at_s[-1]:6.0f} s: {served} requests answered")
        await _sample(result, client, endpoints, time.monotonic() - started)
        answers = {region: await load.stop() for region, load in loads.items()}
        result.tasks_idle_after = await _idle_tasks(client, endpoints)
    everything = [a for region_answers in answers.values() for a in region_answers]
    result.requests = len(everything)
    result.lost = sum(a.lost for a in everything)
    result.hung = sum(a.hung for a in everything)
    for a in everything:
        if a.problem is not None:
            result.problems[a.problem] = result.problems.get(a.problem, 0) + 1
    for region, region_answers in answers.items():
        end = max((a.started_s for a in region_answers), default=0.0)
        result.ttft_ms_first_minute[region] = _p99(a for a in region_answers if a.started_s < 60)
        result.ttft_ms_last_minute[region] = _p99(
            a for a in region_answers if a.started_s >= end - 60
        )
    return result


async def _sample(
    result: SoakReport, client: httpx.AsyncClient, endpoints: Mapping[str, str], at_s: float
) -> None:
    result.sample_at_s.append(at_s)
    for process, pid in _processes(list(endpoints)).items():
        rss = _rss_mib(pid)
        if rss is not None:
            result.rss_mib.setdefault(process, []).append(rss)
    for region, url in endpoints.items():
        result.tasks_under_load.setdefault(region, []).append(await _tasks(client, url))
        hints = (await client.get(f"{url}/readyz")).json()["hints"]
        blocks = sum(int(model["blocks"]) for model in hints.values())
        result.hint_blocks.setdefault(region, []).append(blocks)


def _p99(answers: Iterable[Answer]) -> float | None:
    """p99 TTFT of ``answers`` in ms; ``None`` when none had a first token."""
    return percentile(sorted(a.ttft_s * 1000.0 for a in answers if a.ttft_s), 0.99)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m firstlight_bench.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the load")
    parser.add_argument("--clients", type=int, default=3, help="closed-loop clients per region")
    parser.add_argument("--sample-s", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--warmup-s", type=float, default=30.0, help="load before the first")
    parser.add_argument("--port", type=int, default=8300, help="the HTTP proxy's port")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.clients < 1 or args.sample_s <= 0 or args.warmup_s < 0:
        parser.error("--minutes and --sample-s must be > 0, --clients ≥ 1, --warmup-s ≥ 0")

    from firstlight.serve.local_mode import start_local, stop_local

    config = soak_config(args.port)
    print(f"soak: deploying {', '.join(r.name for r in config.regions)} (sim engine)")
    platform = start_local(config, report=lambda m: print(f"  {m}"), num_cpus=2)
    try:
        result = asyncio.run(
            soak(
                platform.endpoints,
                config.models[0].name,
                args.minutes * 60.0,
                clients=args.clients,
                sample_s=args.sample_s,
                warmup_s=args.warmup_s,
            )
        )
    finally:
        stop_local(platform)
    print(result.markdown())
    if args.out is not None:
        args.out.write_text(json.dumps(asdict(result), indent=2) + "\n")
        print(f"written to {args.out}")
    return 0 if result.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
