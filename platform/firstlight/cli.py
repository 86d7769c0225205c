"""The ``firstlight`` command line (typer + rich).

Entry point of the ``firstlight`` console script and of ``python -m firstlight``. Each
command loads the configuration through :func:`firstlight.config.load_config`, calls one
library function and turns :class:`~firstlight.errors.FirstlightError` into a readable
message and an exit code: 2 for invalid configuration (like a usage error), 1 for any
other failure. Machine-readable output goes to stdout, progress and diagnostics to stderr.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from firstlight import __version__
from firstlight._cli_config import config_app
from firstlight._cli_profile import profile
from firstlight._console import EXIT_FAILURE, prepare_models
from firstlight._console import fail as _fail
from firstlight._console import load as _load
from firstlight._console import run_steps as _run_steps
from firstlight._console import stderr as _stderr
from firstlight.config import PlatformConfig
from firstlight.errors import ConfigError, ConfigProblem, FirstlightError
from firstlight.k8s.cli import status

if TYPE_CHECKING:
    from firstlight.engine.default_model import PreparedModel

__all__ = ["app", "main"]


app = typer.Typer(
    name="firstlight",
    help="Multi-region LLM serving routed by predicted time to first token.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold secrets
)
app.add_typer(config_app, name="config")
app.command("status")(status)
app.command("profile")(profile)


def _mount_plugins(parent: typer.Typer) -> None:
    """Mount the subcommands other installed packages declare in the
    ``firstlight.commands`` entry-point group (``bench``: the benchmark, with the
    ``bench`` extra). The CLI imports none of them itself, so the serving package does
    not depend on the benchmark; one whose dependencies are missing gets a stub that
    says what to install."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="firstlight.commands"):
        try:
            sub = entry.load()
        except ImportError as exc:
            parent.command(entry.name, help=f"(unavailable: {exc.name} is not installed)")(
                _missing(entry.name, exc)
            )
            continue
        parent.add_typer(sub, name=entry.name)


def _missing(name: str, exc: ImportError) -> Callable[[], None]:
    def unavailable() -> None:
        _stderr.print(
            f"error: `firstlight {name}` needs {exc.name}, which is not installed: "
            f"pip install 'firstlight[{name}]'",
            markup=False,
        )
        raise typer.Exit(EXIT_FAILURE)

    return unavailable


_mount_plugins(app)


class Quantize(StrEnum):
    """Quantized variants ``prepare-model`` can also write."""

    int8 = "int8"


@app.command()
def version() -> None:
    """Print Firstlight's version."""
    typer.echo(f"firstlight {__version__}")


@app.command("prepare-model")
def prepare_model(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Configuration file (for cache_dir).")
    ] = None,
    cache_dir: Annotated[
        Path | None, typer.Option(help="Cache folder; the model goes to CACHE_DIR/models/.")
    ] = None,
    force: Annotated[bool, typer.Option(help="Convert again even if already prepared.")] = False,
    quantize: Annotated[
        Quantize | None,
        typer.Option(help="Also write an INT8 W8A8 (compressed-tensors) variant."),
    ] = None,
) -> None:
    """Convert the packaged SmolLM2-135M-Instruct GGUF into a folder vLLM loads offline.

    With ``--quantize int8`` also write its INT8 W8A8 variant (``...-W8A8``) with
    llmcompressor, installed on first use in its own environment under CACHE_DIR/tools.
    """
    from firstlight.engine.default_model import STEPS, prepare_default_model

    cfg = _load(config)
    if cache_dir is not None:
        cfg = cfg.model_copy(update={"cache_dir": cache_dir})
    result = _run_steps(
        "Preparing the default model",
        STEPS,
        lambda on_step: prepare_default_model(cfg.default_model_dir, force=force, progress=on_step),
    )
    _report_prepared(result)
    if quantize is Quantize.int8:
        from firstlight.engine.quantize import QUANTIZE_STEPS, prepare_int8

        quantized = _run_steps(
            "Quantizing",
            QUANTIZE_STEPS,
            lambda on_step: prepare_int8(
                result.path, cfg.cache_dir / "tools", force=force, progress=on_step
            ),
        )
        _report_prepared(quantized, variant=" INT8 W8A8")


def _report_prepared(result: PreparedModel, variant: str = "") -> None:
    what = "Prepared" if result.converted else "Already prepared (verified)"
    summary = result.summary
    typer.echo(
        f"{what}{variant}: {result.path}\n"
        f"  {summary.architecture}, vocabulary {summary.vocab_size}, "
        f"context {summary.max_position_embeddings} tokens"
    )


class EngineChoice(StrEnum):
    """Engines ``up`` can force for every model."""

    vllm = "vllm"
    sim = "sim"


@app.command()
def up(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Configuration file (default: two local regions)."),
    ] = None,
    engine: Annotated[
        EngineChoice | None,
        typer.Option(help="Run every model on this engine (sim: no model memory needed)."),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for readiness.")] = 900.0,
) -> None:
    """Run every region of the config in a local Ray cluster until Ctrl-C.

    Uses the Redis of ``hints.redis_url`` (or starts redis-server when it is local and
    installed; without either, hints are off), prepares the default model when a vLLM
    model needs it, waits until every region answers ``/readyz`` (showing each stage's
    time; a replica that fails to start stops the wait with its error and the log
    folder), and prints each region's endpoint with ready-to-paste ``curl`` and
    ``openai`` examples. Firstlight's own logs follow ``telemetry.log_level``.
    """
    from firstlight.serve.local_mode import LOCAL_DEFAULT, with_engine
    from firstlight.telemetry.logs import configure_logging

    cfg = _load(config) if config is not None else LOCAL_DEFAULT
    configure_logging(cfg.telemetry.log_level, log_format=cfg.telemetry.log_format)
    if engine is not None:
        cfg = with_engine(cfg, engine.value)
    prepare_models(cfg)
    _serve_until_interrupted(cfg, timeout)


def _serve_until_interrupted(cfg: PlatformConfig, timeout: float) -> None:
    import signal
    import threading
    import time

    from firstlight.serve.local_mode import (
        StartupCancelledError,
        start_local,
        stop_local,
        stop_started,
    )

    stop = threading.Event()

    def listen() -> None:
        # Ctrl-C and SIGTERM (from a process manager) both ask for the same clean stop,
        # while starting as while serving. Ray's driver installs handlers of its own when
        # it starts: ours are put back at every stage.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())

    listen()
    started = time.monotonic()
    with _stderr.status("Starting the platform") as status:

        def report(message: str) -> None:
            listen()
            _stderr.print(f"  {message}", markup=False)
            status.update(message)

        try:
            platform = start_local(cfg, report=report, timeout_s=timeout, stopping=stop.is_set)
        except StartupCancelledError:
            _stderr.print("Stopped while starting; stopping what had started...", markup=False)
            stop_started()
            raise typer.Exit(130) from None
        except FirstlightError as exc:
            _fail(exc)
    elapsed = time.monotonic() - started
    model = cfg.models[0].name
    _stderr.print(f"\nReady in {elapsed:.0f} s. {platform.hints_note}", markup=False)
    if not cfg.auth.enabled:
        _stderr.print("Authentication is OFF (local mode): any API key works.", markup=False)
    for region, url in platform.endpoints.items():
        typer.echo(f"  {region:<12} {url}/v1")
    first = next(iter(platform.endpoints.values()))
    typer.echo("\nDashboards (and Prometheus metrics at .../metrics):")
    for region, url in platform.endpoints.items():
        typer.echo(f"  {region:<12} {url}/dashboard")
    typer.echo(
        "\nTry it:\n"
        f"  curl -s {first}/v1/chat/completions -H 'content-type: application/json' "
        f'-d \'{{"model": "{model}", "temperature": 0, "messages": [{{"role": "user", '
        f'"content": "What is the capital of France?"}}]}}\'\n'
        f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{first}/v1', "
        f"api_key='local'); print(c.chat.completions.create(model='{model}', "
        f"messages=[{{'role': 'user', 'content': 'Hello!'}}]).choices[0].message.content)\"\n"
        "\nPress Ctrl-C to stop."
    )
    listen()
    with contextlib.suppress(KeyboardInterrupt):
        while not stop.wait(1.0):
            pass
    _stderr.print("Stopping...", markup=False)
    import ray

    stop_local(platform)
    ray.shutdown()


@app.command()
def serve(
    config: Annotated[Path, typer.Option("--config", "-c", help="Configuration file.")],
    region: Annotated[str | None, typer.Option(help="Region to serve (default: config's).")] = None,
    address: Annotated[str, typer.Option(help="Ray cluster address.")] = "auto",
) -> None:
    """Deploy one region's application on a running Ray cluster (what the Helm chart's
    RayService does through ``firstlight.serve.app:build_app``) and return."""
    import ray
    from ray import serve as ray_serve

    from firstlight.serve.app import region_app
    from firstlight.serve.placement import check_gateway_placement
    from firstlight.telemetry.logs import configure_logging

    cfg = _load(config)
    configure_logging(cfg.telemetry.log_level, log_format=cfg.telemetry.log_format)
    name = region or cfg.region
    if name is None:
        _fail(ConfigError([ConfigProblem("region", "pass --region or set region", None)]))
    try:
        application = region_app(cfg, name)
    except FirstlightError as exc:
        _fail(exc)
    ray.init(address=address)
    try:
        check_gateway_placement(cfg, ray.cluster_resources())  # type: ignore[no-untyped-call]
    except FirstlightError as exc:
        _fail(exc)
    ray_serve.start(http_options={"host": cfg.gateway.host, "port": cfg.gateway.port})
    ray_serve.run(application, name=name, route_prefix="/")
    typer.echo(f"region {name} deployed at http://{cfg.gateway.host}:{cfg.gateway.port}/v1")


@app.command()
def check(
    url: Annotated[
        str, typer.Argument(help="Endpoint base URL (https://us-east.llm.example.com).")
    ],
    model: Annotated[
        str | None, typer.Option(help="Model to ask (default: the first one served).")
    ] = None,
    api_key_file: Annotated[
        Path | None,
        typer.Option(help="File holding the API key (default: $FIRSTLIGHT_API_KEY)."),
    ] = None,
    wait: Annotated[
        float, typer.Option(help="Seconds to keep polling /readyz while the region starts.")
    ] = 0.0,
    timeout: Annotated[float, typer.Option(help="Seconds allowed per HTTP request.")] = 120.0,
) -> None:
    """Check that a region serves: /readyz, /v1/models, then one chat completion.

    What the chart's ``helm test`` pod runs. Exits 1 at the first failing step.
    """
    import os

    from firstlight.k8s.endpoint_check import check_endpoint

    if api_key_file is not None:
        try:
            api_key = api_key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            _stderr.print(f"error: cannot read {api_key_file}: {exc.strerror}", markup=False)
            raise typer.Exit(EXIT_FAILURE) from exc
    else:
        api_key = os.environ.get("FIRSTLIGHT_API_KEY", "")
    if not api_key:
        _stderr.print("error: no API key: pass --api-key-file or set FIRSTLIGHT_API_KEY")
        raise typer.Exit(EXIT_FAILURE)
    steps = check_endpoint(url, api_key, model, wait_s=wait, timeout_s=timeout)
    for step in steps:
        mark = "ok  " if step.ok else "FAIL"
        typer.echo(f"{mark} {step.name:<10} {step.elapsed_ms:8.0f} ms  {step.detail}")
    if not all(step.ok for step in steps):
        raise typer.Exit(EXIT_FAILURE)


def main() -> None:
    """Run the CLI; the ``firstlight`` console script calls this."""
    app()
