"""A ``hf://`` source fetched from the hub stand-in (a real local HTTP server speaking the
hub's file API, :mod:`tests.sources.hub_standin`) through the real ``huggingface_hub``:
the files arrive byte for byte, once per node, and every bad input is named."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from firstlight.errors import ModelSourceError
from firstlight.sources import ensure_model_dir
from firstlight.sources._cache import MARKER_FILE, free_bytes
from tests.sources.conftest import COMMIT, REPO, TOKEN, TOKEN_ENV, folder_bytes, hub_model, platform
from tests.sources.hub_standin import HubStandIn


def _downloads(hub: HubStandIn) -> list[str]:
    return [path for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path]


def test_a_hub_model_arrives_byte_for_byte_with_the_token(
    hub: HubStandIn, small_model: Path, tmp_path: Path
) -> None:
    config = platform(hub_model(hub, f"hf://{REPO}"), tmp_path / "cache")
    folder = ensure_model_dir(config, config.models[0])
    assert folder == config.model_dir(config.models[0])
    assert folder.parent == tmp_path / "cache" / "models" / "fetched"
    assert folder_bytes(folder) == folder_bytes(small_model)
    marker = json.loads((folder / MARKER_FILE).read_text())
    assert marker["source"] == f"hf://{REPO}@main"
    assert marker["revision"] == COMMIT
    assert {auth for _, _, auth in hub.requests} == {f"Bearer {TOKEN}"}
    assert sorted(p.rsplit("/", 2)[-2:][-1] for p in _downloads(hub)) == sorted(
        ["config.json", "tokenizer.json", "part-0.bin"]
    )
    # Nothing but the repository's files and the marker: no staging folder, no lock
    # debris inside, no huggingface_hub bookkeeping.
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [MARKER_FILE, "config.json", "tokenizer.json", "weights"]
    )
    assert not list(folder.parent.glob(".*partial*"))


def test_a_fetched_model_is_reused_without_asking_the_hub_again(
    hub: HubStandIn, tmp_path: Path
) -> None:
    config = platform(hub_model(hub, f"hf://{REPO}"), tmp_path / "cache")
    first = ensure_model_dir(config, config.models[0])
    asked = len(hub.requests)
    assert ensure_model_dir(config, config.models[0]) == first
    assert len(hub.requests) == asked


def test_a_damaged_fetch_is_fetched_again(
    hub: HubStandIn, small_model: Path, tmp_path: Path
) -> None:
    config = platform(hub_model(hub, f"hf://{REPO}"), tmp_path / "cache")
    folder = ensure_model_dir(config, config.models[0])
    (folder / "weights" / "part-0.bin").write_bytes(b"truncated")
    ensure_model_dir(config, config.models[0])
    assert folder_bytes(folder) == folder_bytes(small_model)


def test_two_processes_of_a_node_fetch_once(hub: HubStandIn, tmp_path: Path) -> None:
    # Two threads open the lock file separately, so their flocks exclude each other as
    # two replica processes' do.
    config = platform(hub_model(hub, f"hf://{REPO}"), tmp_path / "cache")
    start = threading.Barrier(2)
    folders: list[Path] = []

    def replica() -> None:
        start.wait(timeout=10)
        folders.append(ensure_model_dir(config, config.models[0]))

    threads = [threading.Thread(target=replica) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(folders) == 2
    assert folders[0] == folders[1]
    assert len(_downloads(hub)) == 3  # each of the three files once


def test_a_pinned_revision_gets_its_own_folder(hub: HubStandIn, tmp_path: Path) -> None:
    on_main = platform(hub_model(hub, f"hf://{REPO}"), tmp_path / "cache")
    pinned = platform(hub_model(hub, f"hf://{REPO}@{COMMIT}"), tmp_path / "cache")
    folder = ensure_model_dir(pinned, pinned.models[0])
    assert folder != on_main.model_dir(on_main.models[0])
    assert json.loads((folder / MARKER_FILE).read_text())["revision"] == COMMIT
    # A commit hash needs no resolving: no request names the branch.
    assert not any("/main" in path for _, path, _ in hub.requests)


@pytest.mark.parametrize(
    ("source", "named"),
    [
        (f"hf://{REPO}@v9", ["revision 'v9'", REPO]),
        ("hf://acme/no-such-model", ["acme/no-such-model", f"${TOKEN_ENV}"]),
    ],
)
def test_a_missing_repository_or_revision_is_named(
    hub: HubStandIn, tmp_path: Path, source: str, named: list[str]
) -> None:
    config = platform(hub_model(hub, source), tmp_path / "cache")
    with pytest.raises(ModelSourceError) as caught:
        ensure_model_dir(config, config.models[0])
    assert "model 'tiny'" in str(caught.value)
    for part in named:
        assert part in str(caught.value)
    assert not config.model_dir(config.models[0]).exists()


def test_a_wrong_token_is_refused_naming_its_variable(
    hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "hf_wrong")
    config = platform(hub_model(hub, f"hf://{REPO}"), tmp_path / "cache")
    with pytest.raises(ModelSourceError, match=rf"refused the token from \${TOKEN_ENV} \(401\)"):
        ensure_model_dir(config, config.models[0])
    assert hub.requests[0][2] == "Bearer hf_wrong"


def test_a_missing_token_names_its_variable(
    hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV)
    config = platform(hub_model(hub, f"hf://{REPO}"), tmp_path / "cache")
    with pytest.raises(ModelSourceError) as caught:
        ensure_model_dir(config, config.models[0])
    assert f"and ${TOKEN_ENV} is unset" in str(caught.value)
    assert REPO in str(caught.value)
    assert hub.requests[0][2] is None  # no token from anywhere else was sent


def test_no_room_for_the_files_is_refused_before_the_first_byte(
    hub: HubStandIn, tmp_path: Path
) -> None:
    # The real free space of the test's file system, read as the fetch reads it; asking
    # to keep more than that free makes the check fail honestly, with no fake disk.
    cache = tmp_path / "cache"
    cache.mkdir()
    keep_gib = free_bytes(cache) // 1024**3 + 1
    model = hub_model(hub, f"hf://{REPO}", min_free_gib=keep_gib)
    config = platform(model, cache)
    with pytest.raises(ModelSourceError) as caught:
        ensure_model_dir(config, model)
    message = str(caught.value)
    folder = str(cache / "models" / "fetched")
    listed = sum(p.stat().st_size for p in (tmp_path / "origin").rglob("*") if p.is_file())
    assert f"no space in {folder}" in message
    assert f"take {listed} bytes" in message
    assert f"({listed + keep_gib * 1024**3} bytes needed)" in message
    assert _downloads(hub) == []
    assert not config.model_dir(model).exists()
