"""Which files of a source the gateway's tokenizer fetch takes, on the file lists of
real repository layouts (names as their hubs list them; sizes made up): the tokenizer's
and chat template's files at the top level, never weights, never a sub-folder's files
but the extra chat templates'."""

from __future__ import annotations

import pytest

from firstlight.errors import ModelSourceError
from firstlight.sources._cache import Listing
from firstlight.sources._subset import TOKENIZER_FILES

WEIGHTS = [
    "model-00001-of-00004.safetensors",
    "consolidated.safetensors",
    "pytorch_model.bin",
    "tf_model.h5",
    "flax_model.msgpack",
    "model.gguf",
    "original/consolidated.00.pth",
    "onnx/model.onnx",
]


@pytest.mark.parametrize(
    ("layout", "tokenizer_files"),
    [
        (  # a Llama 3 repository: the original checkpoint's tokenizer sits in original/
            "llama-3",
            [
                "config.json",
                "generation_config.json",
                "model.safetensors.index.json",
                "special_tokens_map.json",
                "tokenizer.json",
                "tokenizer_config.json",
            ],
        ),
        (  # SentencePiece only, with legacy special-token files
            "sentencepiece",
            [
                "added_tokens.json",
                "config.json",
                "special_tokens_map.json",
                "tokenizer.model",
                "tokenizer_config.json",
            ],
        ),
        (  # GPT-2's vocabulary files, a versioned fast tokenizer, extra chat templates
            "gpt-2",
            [
                "additional_chat_templates/rag.jinja",
                "additional_chat_templates/tool_use.jinja",
                "chat_template.jinja",
                "config.json",
                "merges.txt",
                "tokenizer.4.0.json",
                "tokenizer_config.json",
                "vocab.json",
            ],
        ),
        (  # Mistral: tekken.json, or a versioned SentencePiece model, and params.json
            "mistral",
            [
                "config.json",
                "params.json",
                "tekken.json",
                "tokenizer.model.v3",
                "tokenizer_config.json",
            ],
        ),
        (  # Marian: one SentencePiece model per side
            "marian",
            ["config.json", "source.spm", "target.spm", "tokenizer_config.json", "vocab.json"],
        ),
    ],
)
def test_the_tokenizer_files_are_taken_and_nothing_else(
    layout: str, tokenizer_files: list[str]
) -> None:
    others = [
        *WEIGHTS,
        ".gitattributes",
        "LICENSE",
        "README.md",
        "original/params.json",
        "original/tokenizer.model",
        "additional_chat_templates/old/v1.jinja",
        "1_Pooling/config.json",
    ]
    sizes = {name: 10 + i for i, name in enumerate([*tokenizer_files, *others])}
    listing = Listing(sizes, "0123abcd")
    selected = TOKENIZER_FILES.select("tiny", f"hf://acme/{layout}@main", listing)
    assert selected.files == {name: sizes[name] for name in tokenizer_files}
    assert selected.revision == "0123abcd"


@pytest.mark.parametrize(
    ("files", "missing"),
    [
        (["config.json", "tokenizer.json"], "has no tokenizer_config.json at its top level"),
        (
            # The only vocabulary is in a sub-folder, which transformers does not read.
            ["config.json", "tokenizer_config.json", "original/tokenizer.model"],
            "has no tokenizer.json or tokenizer.*.json or vocab.json or vocab.txt or "
            "tekken.json or *.model or *.model.v* at its top level",
        ),
        (
            ["model.safetensors"],
            "has no config.json; no tokenizer_config.json; no tokenizer.json or ",
        ),
    ],
)
def test_a_source_without_tokenizer_files_is_named(files: list[str], missing: str) -> None:
    listing = Listing(dict.fromkeys(files, 1), "0123abcd")
    with pytest.raises(ModelSourceError) as caught:
        TOKENIZER_FILES.select("tiny", "s3://models/tiny/", listing)
    message = str(caught.value)
    assert message.startswith(f"model 'tiny': s3://models/tiny/ {missing}")
    assert "which the gateway needs to load the model's tokenizer (" in message


@pytest.mark.parametrize("vocabulary", ["vocab.txt", "spiece.model", "tekken.json"])
def test_any_vocabulary_file_will_do(vocabulary: str) -> None:
    files = ["config.json", "tokenizer_config.json", vocabulary, "model.safetensors"]
    listing = Listing(dict.fromkeys(files, 1), "0123abcd")
    selected = TOKENIZER_FILES.select("tiny", "s3://models/tiny/", listing)
    assert sorted(selected.files) == sorted(files[:3])
