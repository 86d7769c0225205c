"""Model sources: a model named by ``hf://<owner>/<name>[@<revision>]`` or
``s3://<bucket>/<prefix>`` is fetched into the node's cache before anything loads it.

Who calls it: every process that loads a model's folder fetches it first —

* :func:`ensure_model_dir` (every file of the source): the model replica before its
  engine starts (``firstlight.serve.model_server.build_engine``), and ``firstlight up``
  before it starts Ray, so a bad token or URL fails there, at once;
* :func:`ensure_tokenizer_dir` (only the tokenizer's and chat template's files, never
  the weights; :data:`~firstlight.sources._subset.TOKENIZER_FILES`): the gateway before
  it loads the model's tokenizer (``firstlight.api.prompts.build_encoder``). On
  Kubernetes the gateways run on the chart's gateway pods, which thus need room for
  tokenizers only. They land in a folder of their own beside the full fetch's; when the node
  already holds the full fetch (``firstlight up``'s, or a replica's on the same node),
  the gateway loads the tokenizer from it and fetches nothing.

Local sources pass through untouched.

The fetch (:mod:`firstlight.sources._cache`) happens once per node and folder under a
file lock, into a hidden folder renamed into place when complete; space is checked
against the listed sizes first. Every failure is a
:class:`~firstlight.errors.ModelSourceError` naming the model and what to fix (for the
tokenizer's fetch, also the tokenizer files the source lacks).
"""

from __future__ import annotations

from pathlib import Path

from firstlight.config import ModelConfig, PlatformConfig
from firstlight.config.model_source import HubSource, LocalSource, S3Source, parse_source
from firstlight.sources._cache import Fetcher, Listing, fetch_once, holds_fetch
from firstlight.sources._subset import TOKENIZER_FILES

__all__ = [
    "Fetcher",
    "Listing",
    "ensure_model_dir",
    "ensure_tokenizer_dir",
    "fetcher_for",
    "is_remote",
]


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


def ensure_tokenizer_dir(config: PlatformConfig, model: ModelConfig) -> Path:
    """The folder to load ``model``'s tokenizer and chat template from: for a remote
    source, the node's full fetch when it is complete, otherwise a folder beside it (its
    name ends in ``-tokenizer``) holding only the tokenizer's files, fetched first;
    for a local source, :meth:`PlatformConfig.model_dir`. Blocking: call it off any
    event loop. Called by the gateway (``firstlight.api.prompts.build_encoder``).

    Raises :class:`~firstlight.errors.ModelSourceError` (naming the tokenizer files the
    source lacks, when it lacks some the gateway needs).
    """
    full = config.model_dir(model)
    fetcher = fetcher_for(model)
    if fetcher is None or holds_fetch(full, fetcher.label):
        return full
    return fetch_once(
        model.name,
        full.with_name(f"{full.name}-{TOKENIZER_FILES.name}"),
        fetcher,
        min_free_gib=model.fetch.min_free_gib,
        subset=TOKENIZER_FILES,
    )
