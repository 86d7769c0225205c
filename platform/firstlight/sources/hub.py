"""A ``hf://<owner>/<name>[@<revision>]`` source: the Hugging Face Hub (or a mirror at
``fetch.hub_endpoint``) through ``huggingface_hub``.

The revision is resolved to its commit once (``repo_info`` with file sizes, for the
space check), then ``snapshot_download`` fetches that commit into the staging folder.
The token is read from the environment variable ``fetch.token_env`` names (the chart
fills it from a Secret). The hub's errors are translated here, at the one boundary that
calls it, into :class:`~firstlight.errors.ModelSourceError` naming the model, the source
and the variable.

Called through :func:`firstlight.sources.ensure_model_dir`.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, NoReturn

from firstlight.config.model_source import FetchSettings, HubSource
from firstlight.errors import ModelSourceError
from firstlight.sources._cache import Listing

__all__ = ["HubFetcher"]


class HubFetcher:
    """Lists and downloads one hub repository at one revision (see the module docstring)."""

    def __init__(self, model: str, source: HubSource, settings: FetchSettings) -> None:
        self.label = str(source)
        self._model = model
        self._source = source
        self._token_env = settings.token_env
        self._token = os.environ.get(settings.token_env) or None
        self._endpoint = settings.hub_endpoint
        self._commit: str | None = None

    def listing(self) -> Listing:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self._endpoint, token=self._token or False)
        try:
            info = api.model_info(
                self._source.repo_id, revision=self._source.revision, files_metadata=True
            )
        except Exception as exc:  # translated, or re-raised by _refused
            self._refused(exc)
        files: dict[str, int] = {}
        for sibling in info.siblings or ():
            if sibling.size is None:
                raise ModelSourceError(
                    f"model {self._model!r}: the hub listed {sibling.rfilename} of "
                    f"{self.label} without its size; is {self._where()} a Hugging Face hub?"
                )
            files[sibling.rfilename] = sibling.size
        if not files or info.sha is None:
            raise ModelSourceError(
                f"model {self._model!r}: {self.label} holds no files at that revision"
            )
        self._commit = info.sha
        return Listing(files, info.sha)

    def download(self, listing: Listing, folder: Path) -> None:
        from huggingface_hub import snapshot_download

        try:
            snapshot_download(
                self._source.repo_id,
                revision=listing.revision,
                local_dir=folder,
                endpoint=self._endpoint,
                token=self._token or False,
                allow_patterns=sorted(listing.files),
                tqdm_class=_no_progress_bar(),
            )
        except Exception as exc:  # translated, or re-raised by _refused
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise  # the cache translates a full disk, naming the folder and the bytes
            self._refused(exc)
        # huggingface_hub keeps its own bookkeeping beside the files; the folder holds
        # the repository's files and nothing else.
        shutil.rmtree(folder / ".cache", ignore_errors=True)

    def _where(self) -> str:
        return self._endpoint or os.environ.get("HF_ENDPOINT") or "the Hugging Face Hub"

    def _refused(self, exc: Exception) -> NoReturn:
        """Raise ``exc`` as a :class:`ModelSourceError` that says what to fix; errors
        that are not the hub's are re-raised as they are (they are bugs)."""
        from huggingface_hub import errors

        model, label, env = repr(self._model), self.label, self._token_env
        token = f"the token from ${env}" if self._token else f"no token (${env} is unset)"
        if isinstance(exc, errors.RevisionNotFoundError):
            message = (
                f"model {model}: the hub has no revision {self._source.revision!r} of "
                f"{self._source.repo_id} ({label}); name a branch, tag or commit it has"
            )
        elif isinstance(exc, errors.GatedRepoError):
            message = (
                f"model {model}: {self._source.repo_id} is gated and the hub refused "
                f"{token}: accept its terms with the token's account and set ${env}"
            )
        elif isinstance(exc, errors.RepositoryNotFoundError) and self._token:
            message = (
                f"model {model}: the hub has no repository {self._source.repo_id} that "
                f"the token from ${env} can see ({label}): check the name, or give ${env} "
                "a token that can read it"
            )
        elif isinstance(exc, errors.RepositoryNotFoundError):
            message = (
                f"model {model}: the hub has no public repository {self._source.repo_id} "
                f"({label}) and ${env} is unset: check the name, or set ${env} to a token "
                "that can read it if it is private"
            )
        elif isinstance(exc, errors.OfflineModeIsEnabled):
            message = (
                f"model {model}: {label} cannot be fetched while HF_HUB_OFFLINE is set; "
                "unset it (the chart sets it only when every model's source is local)"
            )
        elif isinstance(exc, errors.HfHubHTTPError) and _status(exc) in (401, 403):
            what = f"refused the token from ${env}" if self._token else "asks for a token"
            message = (
                f"model {model}: the hub {what} ({_status(exc)}) for {label}: set ${env} to "
                "a valid token that can read the repository"
            )
        elif isinstance(exc, errors.HfHubHTTPError | errors.LocalEntryNotFoundError):
            message = f"model {model}: cannot fetch {label} from {self._where()}: {exc}"
        else:
            import httpx2

            if not isinstance(exc, httpx2.HTTPError):
                raise exc
            message = f"model {model}: cannot reach {self._where()} for {label}: {exc}"
        raise ModelSourceError(message) from exc


def _no_progress_bar() -> type[Any]:
    from huggingface_hub.utils.tqdm import tqdm

    class NoProgressBar(tqdm):
        """The replica's log says when a fetch starts and ends; bars would garble it."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    return NoProgressBar


def _status(exc: Any) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None
