"""The gateway's tokenizer-only fetch, from the hub stand-in (a real local HTTP server,
:mod:`tests.sources.hub_standin`) and moto's S3 server through the real
``huggingface_hub`` and ``boto3``: only the tokenizer's files arrive, the encoder built
from them tokenizes and renders the chat template exactly as one built from the whole
local folder, a full fetch on the node serves instead of a second download, and a source
without tokenizer files is named."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from firstlight.api.prompts import HfPromptEncoder, build_encoder
from firstlight.api.schemas import ChatMessage
from firstlight.config import ModelConfig, PlatformConfig
from firstlight.config.model_source import FetchSettings
from firstlight.errors import ModelSourceError
from firstlight.sources import ensure_model_dir, ensure_tokenizer_dir
from firstlight.sources._cache import MARKER_FILE, free_bytes
from tests.sources.conftest import (
    COMMIT,
    REPO,
    TOKEN,
    TOKEN_ENV,
    folder_bytes,
    hub_model,
    platform,
    upload,
)
from tests.sources.hub_standin import HubStandIn, StandInRepo, running_hub
from tests.sources.tokenizer_model import (
    LAYOUTS,
    OTHER_FILES,
    TOKENIZER_FILES_OF,
    Layout,
    write_tokenizer_model,
)

CONVERSATIONS = [
    [ChatMessage(role="user", content="What is the capital of France?")],
    [
        ChatMessage(role="system", content="You are a helpful assistant."),
        ChatMessage(role="user", content="The capital of France?"),
        ChatMessage(role="assistant", content="Paris."),
        ChatMessage(role="user", content="Answer in one sentence."),
    ],
]


def _downloads(hub: HubStandIn) -> list[str]:
    """Files the stand-in served, by their path in the repository."""
    return sorted(
        path.split(f"/resolve/{COMMIT}/", 1)[1]
        for method, path, _ in hub.requests
        if method == "GET" and "/resolve/" in path
    )


def _pinned(hub: HubStandIn, cache: Path, **fetch: Any) -> tuple[ModelConfig, PlatformConfig]:
    """The model on the hub stand-in at its commit, and a platform caching in ``cache``."""
    model = hub_model(hub, f"hf://{REPO}@{COMMIT}", **fetch)
    return model, platform(model, cache)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _assert_same_encoding(fetched: HfPromptEncoder, local: HfPromptEncoder) -> None:
    assert fetched.vocabulary == local.vocabulary == 384  # config.json's, past the tokenizer's
    for messages in CONVERSATIONS:
        ids = fetched.chat(messages)
        assert ids == local.chat(messages)
        assert len(ids) > len(messages)  # the template's tags are there, tokenized
    text = "The capital of France is Paris."
    assert fetched.text(text) == local.text(text)
    assert fetched.text(text)  # not empty: the vocabulary really loaded


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> Layout:
    layout: Layout = request.param
    return layout


@pytest.fixture
def origin(tmp_path: Path, layout: Layout) -> Path:
    return write_tokenizer_model(tmp_path / "origin", layout)


@pytest.fixture
def tok_hub(origin: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with running_hub({REPO: StandInRepo(origin, COMMIT, token=TOKEN)}) as running:
        yield running


def test_the_gateway_fetches_only_the_tokenizer_from_the_hub(
    tok_hub: HubStandIn, origin: Path, layout: Layout, tmp_path: Path
) -> None:
    model, config = _pinned(tok_hub, tmp_path / "cache")
    encoder = build_encoder(config, model)
    assert isinstance(encoder, HfPromptEncoder)
    assert _downloads(tok_hub) == TOKENIZER_FILES_OF[layout]
    full = config.model_dir(model)
    folder = full.with_name(f"{full.name}-tokenizer")
    assert _files(folder) == sorted([*TOKENIZER_FILES_OF[layout], MARKER_FILE])
    assert not full.exists()  # the weights' folder was never started
    marker = json.loads((folder / MARKER_FILE).read_text())
    assert marker["subset"] == "tokenizer"
    assert sorted(marker["files"]) == TOKENIZER_FILES_OF[layout]
    _assert_same_encoding(encoder, HfPromptEncoder(origin))


@pytest.mark.usefixtures("aws_env")
def test_the_gateway_fetches_only_the_tokenizer_from_s3(
    s3_url: str, origin: Path, layout: Layout, tmp_path: Path
) -> None:
    bucket = f"tok-{uuid.uuid4().hex[:12]}"
    upload(s3_url, origin, bucket, "tiny/v1")
    fetch = FetchSettings(s3_endpoint_url=s3_url)
    model = ModelConfig(name="tiny", source=f"s3://{bucket}/tiny/v1", fetch=fetch)
    config = platform(model, tmp_path / "cache")
    encoder = build_encoder(config, model)
    assert isinstance(encoder, HfPromptEncoder)
    folder = ensure_tokenizer_dir(config, model)
    assert folder.name.endswith("-tokenizer")
    # The S3 fetcher downloads each object of the listing into the staging folder that
    # becomes this one: what is here is what was downloaded.
    assert _files(folder) == sorted([*TOKENIZER_FILES_OF[layout], MARKER_FILE])
    assert not config.model_dir(model).exists()
    _assert_same_encoding(encoder, HfPromptEncoder(origin))


@pytest.mark.parametrize("layout", ["tokenizer.json"], indirect=True)
def test_a_full_fetch_on_the_node_serves_the_gateway_without_a_second_download(
    tok_hub: HubStandIn, origin: Path, tmp_path: Path
) -> None:
    model, config = _pinned(tok_hub, tmp_path / "cache")
    full = ensure_model_dir(config, model)  # as `firstlight up`, or a replica on the node
    asked = len(tok_hub.requests)
    encoder = build_encoder(config, model)
    assert ensure_tokenizer_dir(config, model) == full
    assert len(tok_hub.requests) == asked
    assert not full.with_name(f"{full.name}-tokenizer").exists()
    assert isinstance(encoder, HfPromptEncoder)
    _assert_same_encoding(encoder, HfPromptEncoder(origin))


@pytest.mark.parametrize("layout", ["tokenizer.json"], indirect=True)
def test_a_tokenizer_fetch_is_reused_but_never_taken_for_the_whole_model(
    tok_hub: HubStandIn, origin: Path, tmp_path: Path
) -> None:
    model, config = _pinned(tok_hub, tmp_path / "cache")
    tokenizer = ensure_tokenizer_dir(config, model)
    asked = len(tok_hub.requests)
    assert ensure_tokenizer_dir(config, model) == tokenizer
    assert len(tok_hub.requests) == asked
    # Moved where the whole model belongs, its marker still says it holds the
    # tokenizer's files only: the replica's fetch brings the rest.
    full = config.model_dir(model)
    shutil.copytree(tokenizer, full)
    assert ensure_model_dir(config, model) == full
    assert folder_bytes(full) == folder_bytes(origin)
    assert "subset" not in json.loads((full / MARKER_FILE).read_text())
    assert set(OTHER_FILES) <= set(_downloads(tok_hub))


@pytest.mark.parametrize(
    ("layout", "removed", "named"),
    [
        ("tokenizer.json", ["tokenizer_config.json"], "has no tokenizer_config.json at its"),
        ("tokenizer.json", ["config.json"], "has no config.json at its top level"),
        (
            "vocab.json+merges.txt",
            ["vocab.json", "merges.txt", "config.json"],
            "has no config.json; no tokenizer.json or tokenizer.*.json or vocab.json or ",
        ),
    ],
    indirect=["layout"],
)
def test_missing_tokenizer_files_are_named_before_any_download(
    tok_hub: HubStandIn, origin: Path, tmp_path: Path, removed: list[str], named: str
) -> None:
    for name in removed:
        (origin / name).unlink()
    model, config = _pinned(tok_hub, tmp_path / "cache")
    with pytest.raises(ModelSourceError) as caught:
        build_encoder(config, model)
    message = str(caught.value)
    assert message.startswith(f"model 'tiny': hf://{REPO}@{COMMIT} ")
    assert named in message
    assert "which the gateway needs to load the model's tokenizer (" in message
    assert _downloads(tok_hub) == []
    fetched = tmp_path / "cache" / "models" / "fetched"
    assert [p.name for p in fetched.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.usefixtures("aws_env")
def test_an_s3_prefix_of_weights_only_is_named(
    s3_url: str, small_model: Path, tmp_path: Path
) -> None:
    # small_model: config.json, tokenizer.json and weights — no tokenizer_config.json.
    bucket = f"tok-{uuid.uuid4().hex[:12]}"
    upload(s3_url, small_model, bucket, "tiny/v1")
    fetch = FetchSettings(s3_endpoint_url=s3_url)
    model = ModelConfig(name="tiny", source=f"s3://{bucket}/tiny/v1", fetch=fetch)
    config = platform(model, tmp_path / "cache")
    with pytest.raises(ModelSourceError) as caught:
        build_encoder(config, model)
    assert str(caught.value).startswith(
        f"model 'tiny': s3://{bucket}/tiny/v1/ has no tokenizer_config.json at its top level"
    )


@pytest.mark.parametrize("layout", ["tokenizer.json"], indirect=True)
def test_the_space_check_counts_the_tokenizer_files_only(
    tok_hub: HubStandIn, origin: Path, layout: Layout, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    keep_gib = free_bytes(cache) // 1024**3 + 1  # more than is free: the check must fail
    model, config = _pinned(tok_hub, cache, min_free_gib=keep_gib)
    with pytest.raises(ModelSourceError) as caught:
        build_encoder(config, model)
    tokenizer_bytes = sum((origin / name).stat().st_size for name in TOKENIZER_FILES_OF[layout])
    whole_bytes = sum(p.stat().st_size for p in origin.rglob("*") if p.is_file())
    assert tokenizer_bytes < whole_bytes
    assert f"its tokenizer files take {tokenizer_bytes} bytes" in str(caught.value)
    assert _downloads(tok_hub) == []
