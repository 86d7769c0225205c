"""Redis stopped, ``vllm:*`` still scraped: a real vLLM-CPU replica of the default model
on the session's local Ray cluster exports vLLM's metrics through Ray's metrics agent
(vLLM's ``RayPrometheusStatLogger``), and a real Prometheus scraping that agent with the
chart's engine ``PodMonitor`` relabelings (rendered from the chart, translated field by
field as the Prometheus Operator does) gets ``vllm:prompt_tokens_total`` labelled
``region``/``replica``/``model_name`` — and sees it move by exactly a request's prompt
tokens when that request was made after Redis went away. The local relay through Redis
(``/metrics`` of the gateway) carries the series before the outage and loses them during
it, which is why the chart does not rely on it.

The region's Redis is a private ``redis-server`` on a free port that the test stops (never
the machine's shared one). Waits are polls with deadlines: Ray's agent publishes what
workers recorded every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from firstlight.serve.local_mode import start_local, stop_local
from firstlight.telemetry.engine_metrics import (
    RAY_REPLICA_LABEL,
    RAY_VLLM_PREFIX,
    REPLICA_LABEL,
    VLLM_LABELS,
    VLLM_SERIES,
)
from tests.chart.chart import MONITORING_APIS, render
from tests.conftest import MODEL, Prepared
from tests.hints.conftest import RedisServer, free_port
from tests.serve.cluster import API_KEY, platform_config, vllm_model

pytestmark = pytest.mark.slow

REGION = "em-east"
HEADERS = {"authorization": f"Bearer {API_KEY}"}
PROMPT_TOKENS = "vllm:prompt_tokens_total"
RIVERS = "Rivers of Europe, from the longest: the Volga, the Danube, the Ural, the Dnieper. " * 3
"""Longer than two 32-token blocks, so that sending it twice hits the prefix cache."""
NEVER_MOVED = frozenset({"vllm:num_preemptions_total"})
"""Counters still at zero: Ray's metrics refuse an increment of 0 (vLLM skips it), so
a counter appears at Ray's agent at its first increment — nothing preempts here."""
T = TypeVar("T")


def _engine_relabelings(region: str) -> list[dict[str, Any]]:
    """The chart's engine PodMonitor relabelings for ``region``, as Prometheus'
    ``metric_relabel_configs`` (the operator's camelCase fields in snake_case)."""
    rendered = render({"region": {"name": region}}, api_versions=MONITORING_APIS)
    (monitor,) = [
        m for m in rendered.of_kind("PodMonitor") if m["metadata"]["name"].endswith("-engines")
    ]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    fields = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [
        {fields.get(k, k): v for k, v in rule.items()} for rule in endpoint["metricRelabelings"]
    ]


async def _until(check: Callable[[], Awaitable[T | None]], within_s: float, what: str) -> T:
    """The first truthy value of ``check``, polled until ``within_s`` has passed."""
    deadline = time.monotonic() + within_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.5)  # polling other processes, under a deadline
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def _samples(text: str, name: str, **labels: str) -> list[float]:
    return [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


class _Prometheus:
    """A real Prometheus server scraping Ray's metrics agent every second with the
    engine PodMonitor's relabelings."""

    def __init__(self, work: Path, agent: str) -> None:
        binary = shutil.which("prometheus")
        assert binary is not None, "Prometheus is missing: install Debian's `prometheus` package"
        self.url = f"http://127.0.0.1:{free_port()}"
        job = {
            "job_name": "ray-engines",
            "scrape_interval": "1s",
            "static_configs": [{"targets": [agent]}],
            "metric_relabel_configs": _engine_relabelings(REGION),
        }
        (work / "prometheus.yml").write_text(json.dumps({"scrape_configs": [job]}))
        self._log = (work / "prometheus.log").open("w")
        self._process = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    async def query(self, expr: str) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            try:
                answer = await client.get(f"{self.url}/api/v1/query", params={"query": expr})
            except httpx.TransportError:  # not listening yet
                return []
        data = answer.json()
        assert data["status"] == "success", data
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)
        self._log.close()


def _metrics_agent() -> str:
    """host:port of the metrics agent of the session cluster's (only) node."""
    (node,) = [n for n in ray.nodes() if n["Alive"]]
    return f"{node['NodeManagerAddress']}:{node['MetricsExportPort']}"


class _Replica:
    """Requests to the region's one replica, and its prompt tokens where they are seen."""

    def __init__(self, base: str, client: httpx.AsyncClient, prometheus: _Prometheus) -> None:
        self._base = base
        self._client = client
        self._prometheus = prometheus
        self.id = ""
        self.sent = 0
        """Prompt tokens of every request the replica served."""

    async def complete(self, prompt: str) -> None:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0}
        url = f"{self._base}/v1/completions"
        answer = await self._client.post(url, json=body, headers=HEADERS)
        assert answer.status_code == 200, answer.text
        self.sent += answer.json()["usage"]["prompt_tokens"]
        served_by = answer.headers["x-firstlight-replica"]
        assert self.id in ("", served_by), (self.id, served_by)  # one replica
        self.id = served_by

    async def relayed(self) -> list[float]:
        """Its prompt tokens in the gateway's /metrics (the Redis relay)."""
        scrape = await self._client.get(f"{self._base}/metrics", headers=HEADERS)
        assert scrape.status_code == 200, scrape.text
        return _samples(scrape.text, PROMPT_TOKENS, **{REPLICA_LABEL: self.id})

    async def at_agent(self) -> float | None:
        """Its prompt tokens at Ray's metrics agent, once they equal what was sent."""
        scrape = await self._client.get(f"http://{_metrics_agent()}/metrics")
        name = f"{RAY_VLLM_PREFIX}prompt_tokens_total"
        values = _samples(scrape.text, name, **{RAY_REPLICA_LABEL: self.id})
        return values[0] if values == [self.sent] else None

    async def in_prometheus(self) -> dict[str, Any] | None:
        """Its relabelled series in Prometheus, once it equals what was sent."""
        selector = f'{{region="{REGION}", {REPLICA_LABEL}="{self.id}", model_name="{MODEL}"}}'
        result = await self._prometheus.query(PROMPT_TOKENS + selector)
        if len(result) == 1 and float(result[0]["value"][1]) == self.sent:
            return result[0]
        return None


async def test_vllm_metrics_are_scraped_from_rays_agent_while_redis_is_down(
    serve_port: int, prepared: Prepared, key_file: Path, tmp_path: Path
) -> None:
    folder, _ = prepared
    async with contextlib.AsyncExitStack() as cleanup:
        redis = RedisServer(tmp_path)  # its own port: the machine's Redis is left alone
        cleanup.push_async_callback(redis.stop)
        await redis.start()
        config = platform_config(
            serve_port,
            [{"name": REGION}],
            [vllm_model(MODEL)],
            key_file=key_file,
            extra={
                "cache_dir": str(folder.parent.parent),
                "hints": {"redis_url": redis.url, "key_prefix": f"fltest.{uuid.uuid4().hex[:8]}."},
            },
        )
        platform = await asyncio.to_thread(start_local, config, timeout_s=600)
        cleanup.push_async_callback(asyncio.to_thread, stop_local, platform)
        prometheus = _Prometheus(tmp_path, _metrics_agent())
        cleanup.callback(prometheus.stop)
        client = await cleanup.enter_async_context(httpx.AsyncClient(timeout=60, trust_env=False))
        replica = _Replica(platform.endpoints[REGION], client, prometheus)

        await replica.complete("The capital of France is")
        # Before the outage both paths carry it: the relay (local mode) and Ray's agent.
        await _until(replica.relayed, 30, "the relayed series")
        await _until(replica.in_prometheus, 90, "the series in Prometheus")

        await redis.stop()
        assert await replica.relayed() == []  # the relay is gone with Redis
        before = replica.sent
        for _ in range(2):  # the second finds the first's blocks: a prefix-cache hit
            await replica.complete(RIVERS)
        assert replica.sent > before

        at_agent = await _until(replica.at_agent, 60, f"{replica.sent} at the agent")
        series = await _until(replica.in_prometheus, 60, f"{replica.sent} in Prometheus")
        names = await prometheus.query(f'{{__name__=~"vllm:.+", {REPLICA_LABEL}="{replica.id}"}}')
        assert await replica.relayed() == []  # Redis is still down

    assert at_agent == replica.sent
    assert float(series["value"][1]) == replica.sent  # moved by requests made without Redis
    # The names and labels the dashboards and alerts read, as Prometheus stored them.
    assert series["metric"]["__name__"] == PROMPT_TOKENS
    assert set(series["metric"]) == {"__name__", *VLLM_LABELS, "job", "instance"}
    scraped = {s["metric"]["__name__"] for s in names}
    assert set(VLLM_SERIES) - scraped == NEVER_MOVED, sorted(set(VLLM_SERIES) - scraped)
