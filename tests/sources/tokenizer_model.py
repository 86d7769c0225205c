"""A small model folder with a real tokenizer and chat template, for the tokenizer-only
fetch's tests: a byte-level BPE trained with ``tokenizers`` on a few sentences, saved by
``transformers`` in one of two layouts, beside files a gateway must never fetch (weights,
a nested original checkpoint, a README). The weights are placeholder bytes: nothing in
these tests loads them, and a test that did would fail on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

__all__ = ["LAYOUTS", "OTHER_FILES", "TOKENIZER_FILES_OF", "Layout", "write_tokenizer_model"]

Layout = Literal["tokenizer.json", "vocab.json+merges.txt"]
LAYOUTS: tuple[Layout, ...] = ("tokenizer.json", "vocab.json+merges.txt")

_COMMON = ["chat_template.jinja", "config.json", "generation_config.json", "tokenizer_config.json"]
TOKENIZER_FILES_OF: dict[Layout, list[str]] = {
    "tokenizer.json": sorted([*_COMMON, "tokenizer.json"]),
    "vocab.json+merges.txt": sorted([*_COMMON, "merges.txt", "vocab.json"]),
}
"""The files a tokenizer-only fetch must bring, per layout (written out, not computed)."""

OTHER_FILES = [
    "README.md",
    "model.safetensors",
    "original/consolidated.00.pth",
    "original/params.json",
]
"""Files of every layout that are no part of the tokenizer: the weights, a checkpoint in
another format in a sub-folder (with a JSON file, top-level only in its own folder), and
the model card."""

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "What is the capital of France?",
    "The capital of France is Paris.",
    "You are a helpful assistant. Answer in one sentence.",
]
_SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def write_tokenizer_model(folder: Path, layout: Layout = "tokenizer.json") -> Path:
    """Write the model folder in ``layout``: ``tokenizer.json`` (a fast tokenizer's
    file) or ``vocab.json`` + ``merges.txt`` (GPT-2's vocabulary files, no
    ``tokenizer.json``); both with ``tokenizer_config.json`` and ``chat_template.jinja``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS * 4, trainer)
    folder.mkdir(parents=True)
    bos, eos = (bpe.token_to_id(t) for t in _SPECIAL[:2])
    model_type = "llama"
    if layout == "tokenizer.json":
        fast = PreTrainedTokenizerFast(
            tokenizer_object=bpe, bos_token=_SPECIAL[0], eos_token=_SPECIAL[1]
        )
        fast.chat_template = _CHAT_TEMPLATE
        fast.save_pretrained(folder)
    else:
        model_type = "gpt2"
        saved = json.loads(bpe.to_str())["model"]
        (folder / "vocab.json").write_text(json.dumps(saved["vocab"]))
        merges = [" ".join(pair) for pair in saved["merges"]]
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
        tokenizer_config = {
            "tokenizer_class": "GPT2Tokenizer",
            "bos_token": _SPECIAL[0],
            "eos_token": _SPECIAL[1],
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        (folder / "chat_template.jinja").write_text(_CHAT_TEMPLATE)
    config = {
        "model_type": model_type,
        "vocab_size": 384,  # padded past the tokenizer's, as real models do
        "bos_token_id": bos,
        "eos_token_id": eos,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6}))
    (folder / "README.md").write_text("A model folder for tests.\n")
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 512)
    (folder / "original").mkdir()
    (folder / "original" / "consolidated.00.pth").write_bytes(bytes(256) * 64)
    (folder / "original" / "params.json").write_text('{"dim": 64}\n')
    return folder
