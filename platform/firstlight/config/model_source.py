"""Where a model's weights come from: the forms of ``models[].source``
(:func:`parse_source`) and the settings of fetching one (:class:`FetchSettings`).

``source`` is one of

* ``default``, ``default-int8``, ``default-embedding``: the packaged models;
* ``hf://<org>/<name>[@<revision>]``: a Hugging Face Hub repository, at a branch, tag or
  commit (``main`` when left out). The ``hf://`` prefix is required: a bare
  ``org/name`` is a relative folder, as it always was;
* ``s3://<bucket>/<prefix>``: every object under the prefix, in object storage that
  speaks the S3 API;
* anything else: a local model folder.

Pure: parsing only. :mod:`firstlight.sources` fetches a hub or S3 source into the node's
cache before the engine (and the gateway's tokenizer) load it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field

from firstlight.config._base import Section

__all__ = [
    "HUB_SCHEME",
    "PACKAGED_SOURCES",
    "S3_SCHEME",
    "FetchSettings",
    "HubSource",
    "LocalSource",
    "S3Source",
    "SourceSyntaxError",
    "fetched_folder_name",
    "parse_source",
]

HUB_SCHEME = "hf://"
S3_SCHEME = "s3://"
PACKAGED_SOURCES = ("default", "default-int8", "default-embedding")

# The hub's own rules: names of letters, digits, '-', '_' and '.', not starting or ending
# with '-' or '.'; an owner (user or organisation) and a repository name.
_HUB_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^(?P<repo>{_HUB_NAME}/{_HUB_NAME})(?:@(?P<revision>[^\s@]{{1,255}}))?$")
# S3's bucket naming rules (lowercase, digits, '.', '-'; 3-63 characters).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class SourceSyntaxError(ValueError):
    """A ``hf://`` or ``s3://`` source that does not parse; the message says why."""


@dataclass(frozen=True)
class LocalSource:
    """A model folder on the local file system (or a packaged model's name)."""

    path: str


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face Hub repository at a revision (branch, tag or commit hash)."""

    repo_id: str
    revision: str

    def __str__(self) -> str:
        return f"{HUB_SCHEME}{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class S3Source:
    """Every object under ``prefix`` in ``bucket`` (object storage with the S3 API)."""

    bucket: str
    prefix: str
    """Key prefix without a leading '/', ending in '/' unless empty (the whole bucket):
    ``s3://b/models/x`` and ``s3://b/models/x/`` both mean the objects in ``models/x/``."""

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}"


ModelSource = LocalSource | HubSource | S3Source


def parse_source(source: str) -> ModelSource:
    """The source ``models[].source`` names. Called by :class:`ModelConfig`'s validator
    (so a malformed ``hf://`` or ``s3://`` source fails at load, naming the field) and
    by :mod:`firstlight.sources` and ``PlatformConfig.model_dir``.

    Raises :class:`SourceSyntaxError`.
    """
    if source.startswith(HUB_SCHEME):
        match = _HUB_ID.match(source.removeprefix(HUB_SCHEME))
        if match is None:
            raise SourceSyntaxError(
                "a hub source is hf://<owner>/<name>[@<revision>] (letters, digits, '-', "
                "'_' and '.' in the names; a branch, tag or commit hash after '@')"
            )
        return HubSource(match["repo"], match["revision"] or "main")
    if source.startswith(S3_SCHEME):
        bucket, _, prefix = source.removeprefix(S3_SCHEME).partition("/")
        if not _BUCKET.match(bucket):
            raise SourceSyntaxError(
                f"an S3 source is s3://<bucket>/<prefix>; {bucket!r} is not a bucket name "
                "(3-63 lowercase letters, digits, '.' and '-')"
            )
        prefix = prefix.strip("/")
        return S3Source(bucket, f"{prefix}/" if prefix else "")
    if "://" in source:
        scheme = source.split("://", 1)[0]
        raise SourceSyntaxError(
            f"unknown scheme {scheme}://; a source is a local folder, hf://<owner>/<name>"
            "[@<revision>] or s3://<bucket>/<prefix>"
        )
    return LocalSource(source)


def fetched_folder_name(source: HubSource | S3Source) -> str:
    """The cache sub-folder ``source`` is fetched into: readable, and one per source
    (revision included), so two sources never share a folder. Called by
    ``PlatformConfig.model_dir``."""
    digest = hashlib.sha256(str(source).encode()).hexdigest()[:12]
    if isinstance(source, HubSource):
        readable = f"hf--{source.repo_id}"
    else:
        readable = f"s3--{source.bucket}--{source.prefix}"
    readable = re.sub(r"[^A-Za-z0-9._-]+", "--", readable).strip("-")
    return f"{readable[:96]}-{digest}"


class FetchSettings(Section):
    """How a model whose ``source`` is ``hf://`` or ``s3://`` is fetched: once per node,
    into ``cache_dir``, before the engine and the gateway's tokenizer load it. Ignored
    for a local source."""

    cache_dir: Path | None = None
    """Folder the model is fetched into (one sub-folder per source, and one beside it
    with the tokenizer's files only, which the gateway fetches), shared by every process
    on the node that serves it: the first fetches under a file lock, the others wait and
    reuse it. ``null``: ``<cache_dir>/models/fetched``. A folder already
    fetched is reused without asking the source again, so pin a hub source's revision
    (``@<commit>``) to know what runs."""
    token_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")] = "HF_TOKEN"
    """Environment variable holding the hub token (the chart sets it from a Secret:
    ``modelSources.secretEnv``); unset or empty: no token (public repositories only)."""
    hub_endpoint: Annotated[str | None, Field(pattern=r"^https?://[^\s]+$")] = None
    """Base URL of the hub (a mirror, or a stand-in in tests); ``null``: ``HF_ENDPOINT``
    if set, otherwise the public Hugging Face Hub."""
    s3_endpoint_url: Annotated[str | None, Field(pattern=r"^https?://[^\s]+$")] = None
    """Endpoint of S3-compatible storage (MinIO, Ceph, a stand-in in tests); ``null``:
    AWS's own, or ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` if set. Credentials come
    from the standard AWS chain (environment, shared files, IRSA or Pod Identity)."""
    min_free_gib: Annotated[float, Field(ge=0, le=1_048_576)] = 1.0
    """Free space, in GiB, the cache's file system must keep after the model's files:
    the fetch is refused before it starts when the listed sizes plus this exceed the
    free space, naming the folder and the bytes needed."""
