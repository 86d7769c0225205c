"""The node's model cache: one folder per source (and one per subset of it, such as the
tokenizer's files), fetched once under a file lock, staged in a hidden sibling and
renamed into place only when every listed file is there at its listed size, so a crash
or a full disk never leaves a half-fetched model that looks done.

Private to :mod:`firstlight.sources`; the hub and S3 fetchers plug in through
:class:`Fetcher`, subsets through :class:`firstlight.sources._subset.Subset`.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from firstlight.errors import ModelSourceError

if TYPE_CHECKING:
    from firstlight.sources._subset import Subset

__all__ = ["MARKER_FILE", "Fetcher", "Listing", "fetch_once", "free_bytes", "holds_fetch"]

_log = logging.getLogger(__name__)

MARKER_FILE = ".firstlight-source.json"
"""Written last into a fetched folder: the source, its resolved revision, every file with
its size, and the subset's name when only part of the source was fetched. A folder
without it (or whose files differ from it, or fetched as another subset) is fetched
again."""
_MARKER_FORMAT = 1
_GIB = 1024**3


@dataclass(frozen=True)
class Listing:
    """What a source holds: each file's path (relative, '/'-separated) and size in bytes,
    and the revision they were listed at (a commit hash, or S3's ETags digest)."""

    files: Mapping[str, int]
    revision: str

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())


class Fetcher(Protocol):
    """One source's access: list it, then download a listing into a folder. Both raise
    :class:`ModelSourceError` naming what is wrong (token, repository, object)."""

    label: str
    """The source as the user wrote it, for messages (``hf://org/name@main``)."""

    def listing(self) -> Listing:
        """Files and sizes of the source; called once per fetch, before any download."""
        ...

    def download(self, listing: Listing, folder: Path) -> None:
        """Write every file of ``listing`` under ``folder`` (which does not exist yet)."""
        ...


def free_bytes(folder: Path) -> int:
    """Free bytes on ``folder``'s file system, as an unprivileged process may use them."""
    return shutil.disk_usage(folder).free


def fetch_once(
    model: str,
    target: Path,
    fetcher: Fetcher,
    *,
    min_free_gib: float,
    subset: Subset | None = None,
    free: Callable[[Path], int] = free_bytes,
) -> Path:
    """Return ``target`` holding ``fetcher``'s files (only ``subset``'s, when given),
    fetching them unless a complete fetch of the same source (and subset) is already
    there. Every process of the node that loads the model calls this first (replicas
    for the whole source, gateways for the tokenizer's subset); the file lock makes the
    first fetch and the others wait for it, then reuse it.

    Raises :class:`ModelSourceError`: the fetcher's own errors, a subset's required
    files missing from the source, no room for the listed files plus ``min_free_gib`` in
    ``target``'s file system (checked before the first byte), the disk filling up
    anyway, or files missing after the download.
    """
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelSourceError(
            f"model {model!r}: cannot create the model cache folder {parent}: {exc} "
            "(set fetch.cache_dir to a writable folder)"
        ) from exc
    subset_name = subset.name if subset is not None else None
    with _locked(parent / f".{target.name}.lock", model, fetcher.label):
        if _complete(target, fetcher.label, subset_name):
            _log.info("model %s: reusing %s fetched from %s", model, target, fetcher.label)
            return target
        for stale in parent.glob(f".{target.name}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a fetch that died; the lock is ours
        listing = fetcher.listing()
        if subset is not None:
            listing = subset.select(model, fetcher.label, listing)
        files = f"{subset_name} files" if subset_name else "files"
        needed = listing.total_bytes + int(min_free_gib * _GIB)
        available = free(parent)
        if needed > available:
            raise ModelSourceError(
                f"model {model!r}: no space in {parent} for {fetcher.label}: its {files} take "
                f"{listing.total_bytes} bytes and fetch.min_free_gib keeps {min_free_gib} GiB "
                f"free ({needed} bytes needed), but {available} bytes are free; free space "
                "there or point fetch.cache_dir at a larger volume"
            )
        _log.info(
            "model %s: fetching %s (%d %s, %d bytes) into %s",
            model,
            fetcher.label,
            len(listing.files),
            files,
            listing.total_bytes,
            target,
        )
        _stage(model, target, fetcher, listing, subset_name)
    return target


def holds_fetch(target: Path, label: str) -> bool:
    """True when ``target`` holds a finished fetch of every file of the source ``label``
    names. Called without the lock by :func:`firstlight.sources.ensure_tokenizer_dir`:
    a finished folder is only ever renamed into place whole, so a gateway can load its
    tokenizer from the replicas' full fetch instead of fetching the tokenizer again."""
    return _complete(target, label, None)


def _stage(
    model: str, target: Path, fetcher: Fetcher, listing: Listing, subset: str | None
) -> None:
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        fetcher.download(listing, staging)
        _check_sizes(model, fetcher.label, staging, listing)
        marker: dict[str, object] = {
            "format": _MARKER_FORMAT,
            "source": fetcher.label,
            "revision": listing.revision,
            "files": dict(sorted(listing.files.items())),
        }
        if subset is not None:
            marker["subset"] = subset  # a full fetch's marker has none, as before subsets
        (staging / MARKER_FILE).write_text(json.dumps(marker, indent=1) + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ModelSourceError(
                f"model {model!r}: the disk filled up while fetching {fetcher.label} into "
                f"{target.parent} ({listing.total_bytes} bytes needed): free space there or "
                "point fetch.cache_dir at a larger volume"
            ) from exc
        raise ModelSourceError(
            f"model {model!r}: cannot write {fetcher.label} into {target.parent}: {exc}"
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_sizes(model: str, label: str, folder: Path, listing: Listing) -> None:
    for path, size in listing.files.items():
        file = folder / path
        found = file.stat().st_size if file.is_file() else None
        if found != size:
            raise ModelSourceError(
                f"model {model!r}: {label} gave an incomplete {path} ({found} bytes of "
                f"{size} listed); the fetch is retried when the model next starts"
            )


def _complete(target: Path, label: str, subset: str | None) -> bool:
    """True when ``target`` holds a finished fetch of ``label`` (of ``subset``'s files
    only, or of all when ``None``) with every file intact."""
    try:
        marker = json.loads((target / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("source") != label:
        return False
    if marker.get("subset") != subset:
        return False
    files = marker.get("files")
    if marker.get("format") != _MARKER_FORMAT or not isinstance(files, dict):
        return False
    for path, size in files.items():
        file = target / path
        if not file.is_file() or file.stat().st_size != size:
            return False
    return True


@contextmanager
def _locked(lock_file: Path, model: str, label: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock_file``: held by one process of the node at a time
    (replicas in one pod, or pods sharing a node's folder), released if it dies."""
    try:
        handle = lock_file.open("a")
    except OSError as exc:
        raise ModelSourceError(
            f"model {model!r}: cannot open the lock file {lock_file}: {exc}"
        ) from exc
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.info("model %s: waiting for another process fetching %s", model, label)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
