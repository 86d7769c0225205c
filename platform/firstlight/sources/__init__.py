"""Model sources: a model named by ``hf://<owner>/<name>[@<revision>]`` or
``s3://<bucket>/<prefix>`` is fetched into the node's cache before anything loads it.

Who calls it: every process that loads a model's folder calls
:func:`ensure_model_dir` first — the model replica before its engine starts
(``firstlight.serve.model_server.build_engine``), the gateway before it loads the
model's tokenizer (``firstlight.api.prompts.build_encoder``), and ``firstlight up``
before it starts Ray, so a bad token or URL fails there, at once. Local sources pass
through untouched.

The fetch (:mod:`firstlight.sources._cache`) happens once per node under a file lock,
into a hidden folder renamed into place when complete; space is checked against the
listed sizes first. Every failure is a :class:`~firstlight.errors.ModelSourceError`
naming the model and what to fix.
"""

from __future__ import annotations

from pathlib import Path

from firstlight.config import ModelConfig, PlatformConfig
from firstlight.config.model_source import HubSource, LocalSource, S3Source, parse_source
from firstlight.sources._cache import Fetcher, Listing, fetch_once

__all__ = ["Fetcher", "Listing", "ensure_model_dir", "fetcher_for", "is_remote"]


def is_remote(model: ModelConfig) -> bool:
    """Whether ``model``'s source is fetched (``hf://`` or ``s3://``)."""
    return not isinstance(parse_source(model.source), LocalSource)


def fetcher_for(model: ModelConfig) -> Fetcher | None:
    """The fetcher of ``model``'s source; ``None`` for a local source."""
    source = parse_source(model.source)
    if isinstance(source, HubSource):
        from firstlight.sources.hub import HubFetcher

        return HubFetcher(model.name, source, model.fetch)
    if isinstance(source, S3Source):
        from firstlight.sources.s3 import S3Fetcher

        return S3Fetcher(model.name, source, model.fetch)
    return None


def ensure_model_dir(config: PlatformConfig, model: ModelConfig) -> Path:
    """The folder to load ``model`` from (:meth:`PlatformConfig.model_dir`), fetched
    first when its source is remote. Blocking: call it before the engine starts, off
    any event loop. Raises :class:`~firstlight.errors.ModelSourceError`."""
    target = config.model_dir(model)
    fetcher = fetcher_for(model)
    if fetcher is None:
        return target
    return fetch_once(model.name, target, fetcher, min_free_gib=model.fetch.min_free_gib)
