"""Tenant isolation on a running platform: two keys of two tenants send the same long
prompt. The repeat by the same tenant hits the prefix cache; the other tenant's first
request hits nothing (it can neither reuse nor time-probe the first tenant's cached
prompt), and its own repeat hits again. Real local Ray cluster, ``sim`` engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local
from tests.serve.cluster import platform_config, sim_model

MODEL = "sim-tenants"
KEYS = {"acme": "sk-tenant-acme-0123456789abcdef", "globex": "sk-tenant-globex-0123456789abc"}
PROMPT = "The shared system prompt of both tenants, long enough for many blocks. " * 12

OPERATOR_KEY = "tenants-test-operator-key"


@pytest.fixture(scope="module")
def tenanted(serve_port: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    folder = tmp_path_factory.mktemp("tenant-keys")
    keys = []
    for tenant, key in KEYS.items():
        (folder / tenant).write_text(key)
        keys.append({"file": str(folder / tenant), "tenant": tenant})
    (folder / "operator").write_text(OPERATOR_KEY)
    auth = {
        "enabled": True,
        "api_keys": keys,
        "operator_keys": [{"file": str(folder / "operator")}],
    }
    config = platform_config(
        serve_port, [{"name": "tn-east"}], [sim_model(MODEL)], extra={"auth": auth}
    )
    assert config.auth.isolates_tenants  # on by default once keys name tenants
    running = start_local(config, timeout_s=120)
    yield running
    stop_local(running)


def _cached_tokens(platform: LocalPlatform, tenant: str) -> int:
    response = httpx.post(
        f"{platform.endpoints['tn-east']}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2},
        headers={"authorization": f"Bearer {KEYS[tenant]}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 500
    cached: int = usage["prompt_tokens_details"]["cached_tokens"]
    return cached


@pytest.mark.slow
def test_one_tenants_cached_prompt_gives_another_tenant_nothing(
    tenanted: LocalPlatform,
) -> None:
    assert _cached_tokens(tenanted, "acme") == 0
    acme_repeat = _cached_tokens(tenanted, "acme")
    assert acme_repeat > 500  # the same tenant's repeat hits
    assert _cached_tokens(tenanted, "globex") == 0  # the other tenant's first does not
    assert _cached_tokens(tenanted, "globex") == acme_repeat  # its own repeat does


CANARY = "sk-canary-never-accepted-5f0c1d2e3b4a"


@pytest.mark.slow
def test_no_key_appears_in_logs_metrics_or_the_dashboard(tenanted: LocalPlatform) -> None:
    """After real traffic (and a refused canary key), scan everything the platform wrote:
    every Ray process's log files, /metrics and the dashboard's state."""
    import ray

    base = tenanted.endpoints["tn-east"]
    refused = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {CANARY}"},
        timeout=30,
    )
    assert refused.status_code == 401
    assert CANARY not in refused.text
    _cached_tokens(tenanted, "acme")
    operator = {"authorization": f"Bearer {OPERATOR_KEY}"}
    answers = [
        httpx.get(f"{base}{path}", headers=operator, timeout=30)
        for path in ("/metrics", "/dashboard/api/state")
    ]
    assert [a.status_code for a in answers] == [200, 200]  # what an operator sees
    texts = [a.text for a in answers]
    # The Ray session's log folder (every worker's stdout/stderr, Serve's logs).
    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    files = [p for p in logs.rglob("*") if p.is_file()]
    assert len(files) > 10
    for secret in (*KEYS.values(), CANARY):
        for text in texts:
            assert secret not in text
        needle = secret.encode()
        leaked = [p.name for p in files if needle in p.read_bytes()]
        assert leaked == [], f"a key appears in {leaked}"
