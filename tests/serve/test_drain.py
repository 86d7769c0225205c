"""Graceful shutdown: deleting a region's application lets in-flight streams finish."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from firstlight.serve.local_mode import start_local, stop_local
from tests.serve.cluster import platform_config

pytestmark = pytest.mark.slow


def test_streams_in_flight_complete_when_the_region_is_deleted(serve_port: int) -> None:
    config = platform_config(
        serve_port,
        [{"name": "drain-a"}],
        [{"name": "drain-model", "engine": "sim", "replicas": 1, "resources": {"num_cpus": 0}}],
    )
    platform = start_local(config, timeout_s=120)
    url = f"{platform.endpoints['drain-a']}/v1/completions"
    body = {"model": "drain-model", "prompt": "drain", "max_tokens": 60, "stream": True}

    streaming = threading.Barrier(4, timeout=60)

    def stream() -> list[str]:
        events = []
        with httpx.stream("POST", url, json=body, timeout=120) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line:
                    events.append(line)
                    if len(events) == 1:
                        streaming.wait()  # this stream has its first token
        return events

    with ThreadPoolExecutor(max_workers=3) as pool:
        streams = [pool.submit(stream) for _ in range(3)]
        streaming.wait()  # all three are mid-stream: take the region down under them
        stop_local(platform)
        results = [s.result(timeout=120) for s in streams]
    for events in results:
        assert events[-1] == "data: [DONE]"
        assert '"finish_reason":"length"' in events[-2]
        assert len(events) == 60 + 1
