"""Turning OpenAI requests into token ids, as the engine will see them.

The gateway tokenizes (not the replica) because the router needs the prompt's block
hashes before it can choose a replica. Two implementations of :class:`PromptEncoder`:

* :class:`HfPromptEncoder` — the model's own tokenizer and chat template, loaded from
  the prepared model folder (offline). Used for ``vllm`` models.
* :class:`SimPromptEncoder` — for ``sim`` models: a byte-level encoding with a fixed
  role-tagged template. Simulated engines produce simulated text anyway; this keeps
  them independent of any model files (so CI and capacity studies need none).

Called by the gateway once per request, on its event loop: encoding a prompt of a few
thousand tokens takes well under a millisecond with the Rust tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from firstlight.api.schemas import ChatMessage
from firstlight.config import ModelConfig, PlatformConfig
from firstlight.errors import BadRequestError, ModelNotFoundError

__all__ = [
    "SIM_VOCABULARY",
    "HfPromptEncoder",
    "PromptEncoder",
    "SimPromptEncoder",
    "build_encoder",
]

SIM_VOCABULARY = 65_536
"""Token ids a simulated model accepts: its prompts are bytes (0-255) and its filler
output ids sit well inside; a client's token-id prompt must stay below this too."""


class PromptEncoder(Protocol):
    """Encodes prompts for one model."""

    vocabulary: int
    """Token ids run from 0 to ``vocabulary - 1``: the gateway refuses a token-id prompt
    outside that range (the engine would fail on it)."""

    def chat(
        self, messages: Sequence[ChatMessage], tools: list[Any] | None = None
    ) -> tuple[int, ...]:
        """The chat template applied (with the generation prompt and, when given, the
        request's ``tools`` as the template renders them), tokenized."""
        ...

    def text(self, prompt: str) -> tuple[int, ...]:
        """A raw completion prompt, tokenized (with the model's BOS if it uses one)."""
        ...


class HfPromptEncoder:
    """The model's tokenizer and chat template (``transformers``, local files only);
    ``chat=False`` for an embedding model, which needs no template."""

    def __init__(self, model_dir: Path, *, chat: bool = True) -> None:
        if not (model_dir / "tokenizer_config.json").is_file():
            raise ModelNotFoundError(
                f"no tokenizer in {model_dir} (for the default model, run "
                "`firstlight prepare-model`)"
            )
        from transformers import AutoTokenizer

        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        # vLLM accepts ids up to the larger of the tokenizer's and the model's vocabulary
        # (some models pad their embedding past the tokenizer).
        config = json.loads((model_dir / "config.json").read_text())
        self.vocabulary: int = max(len(self._tokenizer), int(config.get("vocab_size", 0)))
        if chat and not self._tokenizer.chat_template:
            raise ModelNotFoundError(f"the tokenizer in {model_dir} has no chat template")

    def chat(
        self, messages: Sequence[ChatMessage], tools: list[Any] | None = None
    ) -> tuple[int, ...]:
        conversation = [{"role": _hf_role(m.role), "content": m.text()} for m in messages]
        try:
            rendered = self._tokenizer.apply_chat_template(
                conversation, tools=tools, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # the template's own raise_exception(), e.g. role order
            if tools is not None:  # vLLM's layer judges the tools; route on the messages
                return self.chat(messages)
            raise BadRequestError(f"messages: {exc}", param="messages") from exc
        return tuple(self._tokenizer.encode(rendered, add_special_tokens=False))

    def text(self, prompt: str) -> tuple[int, ...]:
        return tuple(self._tokenizer.encode(prompt, add_special_tokens=True))


def _hf_role(role: str) -> str:
    # OpenAI's newer "developer" role is the system prompt for templates that predate it.
    return "system" if role == "developer" else role


class SimPromptEncoder:
    """Byte-level encoding for simulated models: one token per UTF-8 byte, and a chat
    template of ``<role>\\n{content}\\n`` lines ending in ``<assistant>\\n``."""

    vocabulary = SIM_VOCABULARY

    def chat(
        self, messages: Sequence[ChatMessage], tools: list[Any] | None = None
    ) -> tuple[int, ...]:
        rendered = "".join(f"<{_hf_role(m.role)}>\n{m.text()}\n" for m in messages)
        return self.text(rendered + "<assistant>\n")

    def text(self, prompt: str) -> tuple[int, ...]:
        return tuple(prompt.encode("utf-8"))


def build_encoder(config: PlatformConfig, model: ModelConfig) -> PromptEncoder:
    """The encoder for ``model``, the tokenizer's files of its ``hf://`` or ``s3://``
    source fetched first (once per node, never the weights); raises
    ``ModelNotFoundError`` when a ``vllm`` model's folder has no usable tokenizer
    (``ModelSourceError`` when its source cannot be fetched or lacks tokenizer files)."""
    if model.engine == "sim":
        return SimPromptEncoder()
    from firstlight.sources import ensure_tokenizer_dir

    return HfPromptEncoder(ensure_tokenizer_dir(config, model), chat=model.task == "generate")
