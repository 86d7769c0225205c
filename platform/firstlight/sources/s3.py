"""An ``s3://<bucket>/<prefix>`` source: every object under the prefix, through
``boto3``, from AWS or any S3-compatible store at ``fetch.s3_endpoint_url``.

Credentials come from boto3's standard chain (environment variables, shared files,
IRSA or EKS Pod Identity through the pod's service account). Objects keep their path
below the prefix; "folder" marker objects (keys ending in '/') are skipped. S3's errors
are translated here into :class:`~firstlight.errors.ModelSourceError` naming the model
and the URL.

Called through :func:`firstlight.sources.ensure_model_dir`.
"""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

from firstlight.config.model_source import FetchSettings, S3Source
from firstlight.errors import ModelSourceError
from firstlight.sources._cache import Listing

__all__ = ["S3Fetcher"]

_MISSING = {"NoSuchBucket": "no such bucket", "NoSuchKey": "no such object", "404": "not found"}
_DENIED = {
    "AccessDenied",
    "403",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
}


class S3Fetcher:
    """Lists and downloads the objects under one S3 prefix (see the module docstring)."""

    def __init__(self, model: str, source: S3Source, settings: FetchSettings) -> None:
        self.label = str(source)
        self._model = model
        self._source = source
        self._endpoint = settings.s3_endpoint_url
        self._client: Any = None

    def listing(self) -> Listing:
        files: dict[str, int] = {}
        etags: list[str] = []
        try:
            pages = (
                self._s3()
                .get_paginator("list_objects_v2")
                .paginate(Bucket=self._source.bucket, Prefix=self._source.prefix)
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    key: str = item["Key"]
                    if key.endswith("/"):
                        continue
                    files[self._relative(key)] = int(item["Size"])
                    etags.append(f"{key}:{item.get('ETag', '')}")
        except Exception as exc:  # translated, or re-raised by _refused
            self._refused(exc, self.label)
        if not files:
            raise ModelSourceError(
                f"model {self._model!r}: no objects under {self.label}: check the "
                "bucket and prefix (the prefix is a folder of the model's files)"
            )
        digest = hashlib.sha256("\n".join(sorted(etags)).encode()).hexdigest()
        return Listing(files, f"etags-sha256:{digest}")

    def download(self, listing: Listing, folder: Path) -> None:
        client = self._s3()
        for path in sorted(listing.files):
            key = f"{self._source.prefix}{path}"
            destination = folder / path
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                client.download_file(self._source.bucket, key, str(destination))
            except Exception as exc:  # translated, or re-raised by _refused
                if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                    raise  # the cache translates a full disk, naming the folder and bytes
                self._refused(exc, f"s3://{self._source.bucket}/{key}")

    def _s3(self) -> Any:
        if self._client is None:
            import boto3

            # A session of its own: credentials are read now (the default session would
            # keep the first ones it found), and sessions are not shared across threads.
            session = boto3.session.Session()
            self._client = session.client("s3", endpoint_url=self._endpoint)
        return self._client

    def _relative(self, key: str) -> str:
        """``key`` below the prefix, refused when it would leave the model's folder."""
        relative = PurePosixPath(key.removeprefix(self._source.prefix))
        if relative.is_absolute() or ".." in relative.parts:
            raise ModelSourceError(
                f"model {self._model!r}: the object s3://{self._source.bucket}/{key} "
                "has a path outside its prefix; it cannot be part of a model folder"
            )
        return str(relative)

    def _refused(self, exc: Exception, url: str) -> NoReturn:
        """Raise ``exc`` as a :class:`ModelSourceError` naming ``url`` and what to fix;
        errors that are not boto3's are re-raised as they are."""
        from botocore import exceptions

        model = repr(self._model)
        if isinstance(exc, exceptions.NoCredentialsError):
            message = (
                f"model {model}: no AWS credentials for {url}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (the chart's modelSources.secretEnv) or give the "
                "pods a role (serviceAccount, IRSA or Pod Identity)"
            )
        elif isinstance(exc, exceptions.ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _MISSING:
                message = f"model {model}: {url}: {_MISSING[code]} ({code})"
            elif code in _DENIED:
                message = (
                    f"model {model}: access to {url} denied ({code}): the credentials "
                    "must allow s3:ListBucket on the bucket and s3:GetObject on the prefix"
                )
            else:
                message = f"model {model}: {url}: {exc}"
        elif isinstance(exc, exceptions.BotoCoreError):
            where = self._endpoint or "S3"
            message = f"model {model}: cannot reach {where} for {url}: {exc}"
        else:
            raise exc
        raise ModelSourceError(message) from exc
