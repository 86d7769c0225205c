"""What every ``firstlight`` command shares: the stderr console, turning a
:class:`~firstlight.errors.FirstlightError` into a message and an exit code (2 for
invalid configuration, 1 for any other failure), loading the configuration, and the
progress display of the default model's preparation.

Used by :mod:`firstlight.cli` and by the benchmark's commands (``firstlight bench``),
which is why it is not in ``cli.py``: the benchmark's commands are mounted by the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from firstlight.config import PlatformConfig, load_config
from firstlight.errors import ConfigError, FirstlightError, ModelNotFoundError

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INVALID_CONFIG",
    "STEP_TEXT",
    "fail",
    "load",
    "prepare_models",
    "run_steps",
    "stderr",
]

_T = TypeVar("_T")

EXIT_FAILURE = 1
EXIT_INVALID_CONFIG = 2

stderr = Console(stderr=True, highlight=False, soft_wrap=True)

STEP_TEXT = {
    "locate": "Locating the packaged GGUF file",
    "tokenizer": "Loading the tokenizer",
    "weights": "Dequantizing the weights",
    "save": "Writing the Hugging Face folder",
    "verify": "Verifying config, tokenizer and chat template",
    "tool": "Installing the quantization tool (first use only, about a minute)",
    "quantize": "Quantizing weights to INT8 (W8A8)",
}


def run_steps(
    title: str, steps: tuple[str, ...], work: Callable[[Callable[[str], None]], _T]
) -> _T:
    """Run ``work`` under a progress display that follows its named steps; a
    :class:`FirstlightError` becomes a message and an exit code."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr, transient=True) as bar:
        task = bar.add_task(title, total=len(steps))

        def on_step(step: str) -> None:
            bar.update(task, description=STEP_TEXT[step], completed=steps.index(step))

        try:
            result = work(on_step)
        except FirstlightError as exc:
            fail(exc)
        bar.update(task, completed=len(steps))
    return result


def prepare_models(cfg: PlatformConfig) -> None:
    """Prepare the default model when a vLLM model of ``cfg`` needs it (``firstlight up``
    and ``firstlight bench live``), with a progress display, and fetch every ``hf://`` or
    ``s3://`` source; exits with an error naming the model when a source cannot be
    fetched, a vLLM model's folder holds no model, or its ``vllm.engine_args`` name an
    argument this vLLM lacks or a value of the wrong type (before any Ray or engine
    starts)."""
    if any(m.engine == "vllm" and m.source == "default" for m in cfg.models):
        from firstlight.engine.default_model import STEPS, prepare_default_model

        run_steps(
            "Preparing the default model",
            STEPS,
            lambda on_step: prepare_default_model(cfg.default_model_dir, progress=on_step),
        )
    from firstlight.engine.vllm_args import check_engine_args, check_model_files
    from firstlight.sources import ensure_model_dir

    try:
        for model in cfg.models:
            if model.engine == "vllm":
                check_model_files(model, ensure_model_dir(cfg, model))
                check_engine_args(model)  # imports vLLM only when the model has some
    except (ModelNotFoundError, ConfigError) as exc:
        fail(exc)


def load(path: Path | None) -> PlatformConfig:
    """The configuration at ``path`` (or the default); invalid: a message and exit 2."""
    try:
        return load_config(path)
    except ConfigError as exc:
        fail(exc)


def fail(exc: FirstlightError) -> NoReturn:
    """Print ``exc`` for a person (every problem of a configuration error) and exit."""
    if isinstance(exc, ConfigError):
        where = f" in {exc.source}" if exc.source else ""
        stderr.print(f"error: invalid configuration{where}:", markup=False)
        for problem in exc.problems:
            stderr.print(f"  - {problem}", markup=False)
        raise typer.Exit(EXIT_INVALID_CONFIG)
    stderr.print(f"error: {exc}", markup=False)
    raise typer.Exit(EXIT_FAILURE)
