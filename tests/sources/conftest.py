"""Fixtures of the model-source tests: a small repository folder, the hub stand-in
serving it (:mod:`tests.sources.hub_standin`) and an S3-compatible server from PyPI
(moto's ``ThreadedMotoServer``, a real local HTTP server) as the stand-in for object
storage. Neither is the real service: both are named stand-ins wherever they appear."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from firstlight.config import ModelConfig, PlatformConfig
from firstlight.config.model_source import FetchSettings
from firstlight.sources._cache import MARKER_FILE
from tests.sources.hub_standin import HubStandIn, StandInRepo, running_hub

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_standin_secret"
TOKEN_ENV = "FIRSTLIGHT_TEST_HUB_TOKEN"
REPO = "acme/tiny-model"


def write_small_model(folder: Path) -> Path:
    """A folder shaped like a model's (its files need not load: the fetch tests look at
    bytes only), with a sub-folder and a binary file."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    (folder / "tokenizer.json").write_text('{"version": "1.0"}\n')
    (folder / "weights").mkdir()
    (folder / "weights" / "part-0.bin").write_bytes(bytes(range(256)) * 64)
    return folder


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file of a model folder and its bytes, the fetch's marker left out."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MARKER_FILE
    }


def upload(s3_url: str, folder: Path, bucket: str, prefix: str) -> None:
    """Put every file of ``folder`` under ``prefix`` (with a folder marker object, as
    some tools write, which the fetch skips)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_url)
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key=f"{prefix}/", Body=b"")
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            client.upload_file(str(file), bucket, f"{prefix}/{file.relative_to(folder)}")


def hub_model(hub: HubStandIn, source: str, **fetch: Any) -> ModelConfig:
    """A model whose source is on the hub stand-in, its token read from ``TOKEN_ENV``."""
    settings = FetchSettings(hub_endpoint=hub.url, token_env=TOKEN_ENV, **fetch)
    return ModelConfig(name="tiny", source=source, fetch=settings)


def platform(model: ModelConfig, cache_dir: Path) -> PlatformConfig:
    return PlatformConfig(cache_dir=cache_dir, models=(model,))


@pytest.fixture
def small_model(tmp_path: Path) -> Path:
    return write_small_model(tmp_path / "origin")


@pytest.fixture
def hub(small_model: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    """The hub stand-in with one private repository (``REPO``, token ``TOKEN``), the
    token in ``TOKEN_ENV``."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with running_hub({REPO: StandInRepo(small_model, COMMIT, token=TOKEN)}) as running:
        yield running


@pytest.fixture(scope="session")
def s3_url() -> Iterator[str]:
    """An S3-compatible server (moto, the stand-in for object storage) on a free port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials from the environment, as the chart's Secret gives them; no shared
    files and no instance metadata, so nothing else on the machine is read."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "standin-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "standin-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
