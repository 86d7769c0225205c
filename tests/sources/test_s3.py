"""A ``s3://`` source fetched through the real boto3 from an S3-compatible server run
locally (moto's ``ThreadedMotoServer``, the stand-in for object storage): the folder
arrives byte for byte, and a missing bucket, prefix or object, and missing or refused
credentials, are named."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from firstlight.config import ModelConfig
from firstlight.config.model_source import FetchSettings, S3Source, parse_source
from firstlight.errors import ModelSourceError
from firstlight.sources import ensure_model_dir
from firstlight.sources.s3 import S3Fetcher
from tests.sources.conftest import folder_bytes, platform, upload

pytestmark = pytest.mark.usefixtures("aws_env")


def _client(s3_url: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=s3_url)


def s3_model(s3_url: str, source: str) -> ModelConfig:
    return ModelConfig(name="tiny", source=source, fetch=FetchSettings(s3_endpoint_url=s3_url))


@pytest.fixture
def bucket(s3_url: str, small_model: Path) -> str:
    name = f"models-{uuid.uuid4().hex[:12]}"
    upload(s3_url, small_model, name, "tiny/v1")
    return name


@pytest.mark.parametrize("suffix", ["", "/"])
def test_an_s3_model_arrives_byte_for_byte(
    s3_url: str, bucket: str, small_model: Path, tmp_path: Path, suffix: str
) -> None:
    config = platform(s3_model(s3_url, f"s3://{bucket}/tiny/v1{suffix}"), tmp_path / "cache")
    folder = ensure_model_dir(config, config.models[0])
    assert folder_bytes(folder) == folder_bytes(small_model)
    assert folder.name.startswith(f"s3--{bucket}--tiny--v1-")


def test_the_whole_bucket_is_a_prefix_too(s3_url: str, small_model: Path, tmp_path: Path) -> None:
    name = f"whole-{uuid.uuid4().hex[:12]}"
    client = _client(s3_url)
    client.create_bucket(Bucket=name)
    for file in small_model.rglob("*"):
        if file.is_file():
            client.upload_file(str(file), name, str(file.relative_to(small_model)))
    config = platform(s3_model(s3_url, f"s3://{name}"), tmp_path / "cache")
    assert folder_bytes(ensure_model_dir(config, config.models[0])) == folder_bytes(small_model)


@pytest.mark.parametrize(
    ("where", "named"),
    [
        ("s3://no-such-bucket-here/tiny", "s3://no-such-bucket-here/tiny/: no such bucket"),
        ("{bucket}/tiny/v2", "no objects under s3://{bucket}/tiny/v2/"),
    ],
)
def test_a_missing_bucket_or_prefix_is_named(
    s3_url: str, bucket: str, tmp_path: Path, where: str, named: str
) -> None:
    source = where.format(bucket=f"s3://{bucket}")
    config = platform(s3_model(s3_url, source), tmp_path / "cache")
    with pytest.raises(ModelSourceError) as caught:
        ensure_model_dir(config, config.models[0])
    assert str(caught.value).startswith("model 'tiny': ")
    assert named.format(bucket=bucket) in str(caught.value)
    assert not config.model_dir(config.models[0]).exists()


def test_an_object_gone_after_the_listing_is_named(
    s3_url: str, bucket: str, tmp_path: Path
) -> None:
    source = parse_source(f"s3://{bucket}/tiny/v1")
    assert isinstance(source, S3Source)
    fetcher = S3Fetcher("tiny", source, FetchSettings(s3_endpoint_url=s3_url))
    listing = fetcher.listing()
    _client(s3_url).delete_object(Bucket=bucket, Key="tiny/v1/weights/part-0.bin")
    with pytest.raises(ModelSourceError) as caught:
        fetcher.download(listing, tmp_path / "staging")
    assert f"s3://{bucket}/tiny/v1/weights/part-0.bin: not found" in str(caught.value)


def test_missing_credentials_are_named(
    s3_url: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    config = platform(s3_model(s3_url, f"s3://{bucket}/tiny/v1"), tmp_path / "cache")
    with pytest.raises(ModelSourceError) as caught:
        ensure_model_dir(config, config.models[0])
    assert f"no AWS credentials for s3://{bucket}/tiny/v1/" in str(caught.value)
    assert "AWS_ACCESS_KEY_ID" in str(caught.value)


def test_an_object_outside_its_prefix_is_refused(s3_url: str, tmp_path: Path) -> None:
    name = f"odd-{uuid.uuid4().hex[:12]}"
    client = _client(s3_url)
    client.create_bucket(Bucket=name)
    client.put_object(Bucket=name, Key="m/../../escape", Body=b"x")
    config = platform(s3_model(s3_url, f"s3://{name}/m"), tmp_path / "cache")
    with pytest.raises(ModelSourceError, match="has a path outside its prefix"):
        ensure_model_dir(config, config.models[0])
    assert not (tmp_path / "cache" / "escape").exists()


@pytest.fixture
def enforced_auth(s3_url: str) -> Any:
    """The S3 stand-in checking credentials against its IAM (moto's ``reset-auth``):
    yields the keys of a user with no permissions; restored to open afterwards."""
    import boto3
    import httpx

    iam = boto3.client("iam", endpoint_url=s3_url)
    user = iam.create_user(UserName=f"reader-{uuid.uuid4().hex[:12]}")["User"]["UserName"]
    created = iam.create_access_key(UserName=user)
    httpx.post(f"{s3_url}/moto-api/reset-auth", content=b"0", timeout=10).raise_for_status()
    try:
        yield created["AccessKey"]
    finally:
        httpx.post(f"{s3_url}/moto-api/reset-auth", content=b"inf", timeout=10).raise_for_status()


@pytest.mark.parametrize("known", [True, False], ids=["no-permission", "unknown-key"])
def test_refused_credentials_are_named(
    s3_url: str,
    bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    enforced_auth: Any,
    known: bool,
) -> None:
    key_id = enforced_auth["AccessKeyId"] if known else "AKIAUNKNOWNKEY000000"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", enforced_auth["SecretAccessKey"])
    config = platform(s3_model(s3_url, f"s3://{bucket}/tiny/v1"), tmp_path / "cache")
    with pytest.raises(ModelSourceError) as caught:
        ensure_model_dir(config, config.models[0])
    code = "AccessDenied" if known else "InvalidAccessKeyId"
    assert f"access to s3://{bucket}/tiny/v1/ denied ({code})" in str(caught.value)
    assert not config.model_dir(config.models[0]).exists()
