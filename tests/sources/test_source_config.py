"""``models[].source``'s forms: what parses, what is refused naming the field, and the
cache folder each remote source gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstlight.config import ModelConfig, PlatformConfig, parse_config
from firstlight.config.model_source import (
    FetchSettings,
    HubSource,
    LocalSource,
    S3Source,
    parse_source,
)
from firstlight.errors import ConfigError
from firstlight.sources import is_remote


@pytest.mark.parametrize(
    ("source", "parsed"),
    [
        ("hf://acme/tiny-model", HubSource("acme/tiny-model", "main")),
        ("hf://acme/tiny.model_2@v1.0", HubSource("acme/tiny.model_2", "v1.0")),
        ("hf://acme/m@refs/pr/3", HubSource("acme/m", "refs/pr/3")),
        ("s3://models/llama/8b", S3Source("models", "llama/8b/")),
        ("s3://models/llama/8b/", S3Source("models", "llama/8b/")),
        ("s3://models", S3Source("models", "")),
        ("acme/tiny-model", LocalSource("acme/tiny-model")),
        ("/models/llama", LocalSource("/models/llama")),
        ("default", LocalSource("default")),
    ],
)
def test_sources_parse(source: str, parsed: object) -> None:
    assert parse_source(source) == parsed


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("hf://tiny-model", "hf://<owner>/<name>[@<revision>]"),
        ("hf://acme/tiny@", "hf://<owner>/<name>[@<revision>]"),
        ("hf://acme/-bad", "hf://<owner>/<name>[@<revision>]"),
        ("s3://Bad_Bucket/x", "'Bad_Bucket' is not a bucket name"),
        ("gs://models/x", "unknown scheme gs://"),
    ],
)
def test_a_malformed_source_is_refused_naming_the_field(source: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"models": [{"name": "m", "source": source}]})
    problem = str(caught.value)
    assert f"models[0].source = {source!r}" in problem
    assert why in problem


def test_each_remote_source_gets_its_own_cache_folder(tmp_path: Path) -> None:
    sources = ["hf://acme/m", "hf://acme/m@v2", "s3://bucket/acme/m", "s3://bucket/acme-m"]
    models = tuple(ModelConfig(name=f"m{i}", source=s) for i, s in enumerate(sources))
    config = PlatformConfig(cache_dir=tmp_path, models=models)
    folders = [config.model_dir(m) for m in models]
    assert len(set(folders)) == len(folders)
    assert {f.parent for f in folders} == {tmp_path / "models" / "fetched"}
    assert all(is_remote(m) for m in models)
    # "hf://acme/m" and "hf://acme/m@main" are one source, so one folder.
    same = ModelConfig(name="x", source="hf://acme/m@main")
    assert config.model_dir(same) == folders[0]


def test_fetch_cache_dir_moves_the_folder(tmp_path: Path) -> None:
    model = ModelConfig(
        name="m", source="hf://acme/m", fetch=FetchSettings(cache_dir=tmp_path / "node")
    )
    config = PlatformConfig(cache_dir=tmp_path / "cache", models=(model,))
    assert config.model_dir(model).parent == tmp_path / "node"
    local = ModelConfig(name="l", source=str(tmp_path / "here"))
    assert config.model_dir(local) == tmp_path / "here"
    assert not is_remote(local)


@pytest.mark.parametrize(
    ("field", "value"),
    [("token_env", "HF TOKEN"), ("hub_endpoint", "mirror.example"), ("min_free_gib", -1)],
)
def test_fetch_settings_are_checked(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"models\[0\]\.fetch\.{field}"):
        parse_config({"models": [{"name": "m", "source": "hf://a/b", "fetch": {field: value}}]})
