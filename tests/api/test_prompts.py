"""Prompt encoders: the byte-level one of simulated models, and the real model's own
tokenizer and chat template (the default model, really prepared)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from firstlight.api.prompts import HfPromptEncoder, SimPromptEncoder, build_encoder
from firstlight.api.schemas import ChatMessage
from firstlight.config import parse_config
from firstlight.errors import ModelNotFoundError
from tests.conftest import Prepared


def _messages(*pairs: tuple[str, Any]) -> list[ChatMessage]:
    return [
        ChatMessage.model_validate({"role": role, "content": content}) for role, content in pairs
    ]


# --- simulated models ------------------------------------------------------------------


def test_sim_chat_template_is_role_tagged_lines_ending_with_the_assistant() -> None:
    ids = SimPromptEncoder().chat(_messages(("system", "Be brief."), ("user", "Hi!")))
    assert bytes(ids) == b"<system>\nBe brief.\n<user>\nHi!\n<assistant>\n"


def test_sim_developer_role_is_the_system_prompt() -> None:
    encoder = SimPromptEncoder()
    developer = encoder.chat(_messages(("developer", "Be brief."), ("user", "Hi!")))
    system = encoder.chat(_messages(("system", "Be brief."), ("user", "Hi!")))
    assert developer == system


def test_sim_chat_joins_text_parts_and_renders_null_content_empty() -> None:
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    ids = SimPromptEncoder().chat(_messages(("user", parts), ("assistant", None)))
    assert bytes(ids) == b"<user>\nHello\n<assistant>\n\n<assistant>\n"


def test_sim_text_is_one_token_per_utf8_byte() -> None:
    ids = SimPromptEncoder().text("Köln 🚀")
    assert ids == tuple("Köln 🚀".encode())
    assert len(ids) == 10
    assert all(0 <= i < 256 for i in ids)


def test_sim_encoding_is_deterministic_and_prefix_stable() -> None:
    encoder = SimPromptEncoder()
    short = encoder.chat(_messages(("system", "S"), ("user", "a")))
    longer = encoder.chat(
        _messages(("system", "S"), ("user", "a"), ("assistant", "b"), ("user", "c"))
    )
    assert encoder.chat(_messages(("system", "S"), ("user", "a"))) == short
    # a conversation's earlier turns keep their tokens, so prefix caching can reuse them
    assert longer[: len(short) - len(b"<assistant>\n")] == short[: -len(b"<assistant>\n")]


def test_build_encoder_picks_by_engine(tmp_path: Path) -> None:
    config = parse_config(
        {
            "mode": "local",
            "regions": [{"name": "us-east"}],
            "models": [
                {"name": "sim-model", "engine": "sim"},
                {"name": "real", "source": str(tmp_path)},
            ],
        }
    )
    sim, real = config.models
    assert isinstance(build_encoder(config, sim), SimPromptEncoder)
    with pytest.raises(ModelNotFoundError, match="no tokenizer"):
        build_encoder(config, real)


def test_hf_encoder_needs_a_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no tokenizer"):
        HfPromptEncoder(tmp_path)


# --- the real model's tokenizer --------------------------------------------------------


def _reference(folder: Path, conversation: list[dict[str, str]]) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    encoded = tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    ids: list[int] = list(encoded["input_ids"])
    return ids


CONVERSATIONS = [
    ("user-only", [("user", "What is the capital of France?")]),
    ("system-and-user", [("system", "Answer in one word."), ("user", "Capital of France?")]),
    (
        "multi-turn",
        [
            ("system", "You are terse."),
            ("user", "Hi"),
            ("assistant", "Hello."),
            ("user", "Grüße aus Köln — 東京 🚀"),
        ],
    ),
]


@pytest.mark.parametrize("pairs", [c[1] for c in CONVERSATIONS], ids=[c[0] for c in CONVERSATIONS])
def test_hf_chat_equals_the_tokenizer_chat_template(
    prepared: Prepared, pairs: list[tuple[str, str]]
) -> None:
    folder, _ = prepared
    ids = HfPromptEncoder(folder).chat(_messages(*pairs))
    assert isinstance(ids, tuple)
    assert list(ids) == _reference(folder, [{"role": r, "content": c} for r, c in pairs])


def test_hf_developer_role_is_treated_as_system(prepared: Prepared) -> None:
    folder, _ = prepared
    encoder = HfPromptEncoder(folder)
    developer = encoder.chat(
        _messages(("developer", "Answer in one word."), ("user", "Capital of France?"))
    )
    system = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
    ]
    assert list(developer) == _reference(folder, system)
    # Untranslated, the template would add its default system prompt before the turn.
    user_only = encoder.chat(_messages(("user", "Capital of France?")))
    assert developer != user_only


def test_hf_chat_joins_text_parts(prepared: Prepared) -> None:
    folder, _ = prepared
    encoder = HfPromptEncoder(folder)
    parts = [{"type": "text", "text": "Capital of "}, {"type": "text", "text": "France?"}]
    assert encoder.chat(_messages(("user", parts))) == encoder.chat(
        _messages(("user", "Capital of France?"))
    )


def test_hf_text_is_the_tokenizer_encoding(prepared: Prepared) -> None:
    from transformers import AutoTokenizer

    folder, _ = prepared
    tokenizer: Any = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    prompt = "Once upon a time"
    ids = HfPromptEncoder(folder).text(prompt)
    assert list(ids) == tokenizer.encode(prompt, add_special_tokens=True)
    assert tokenizer.decode(list(ids), skip_special_tokens=True) == prompt
