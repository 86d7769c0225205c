"""Part of a source's files, fetched on its own: the gateway needs a model's tokenizer and
chat template, not its weights (:data:`TOKENIZER_FILES`).

Private to :mod:`firstlight.sources`: :func:`firstlight.sources.ensure_tokenizer_dir`
passes a :class:`Subset` to :func:`firstlight.sources._cache.fetch_once`, which narrows
the source's listing with :meth:`Subset.select` before the space check and the download,
so the hub and S3 fetchers download only what the narrowed listing names.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from firstlight.errors import ModelSourceError
from firstlight.sources._cache import Listing

__all__ = ["TOKENIZER_FILES", "Subset"]


@dataclass(frozen=True)
class Subset:
    """Files of a source picked by glob patterns, matched one path segment at a time (so
    ``*.json`` is a top-level file, never ``original/params.json``)."""

    name: str
    """Names the subset: the suffix of its cache folder, the ``subset`` of its marker, and
    what messages call its files ("tokenizer files")."""
    patterns: tuple[str, ...]
    """A file is part of the subset when its path matches one of these."""
    required: tuple[tuple[str, ...], ...]
    """Each entry: patterns of which at least one must match a file of the source, or the
    fetch is refused before it starts."""

    def select(self, model: str, label: str, listing: Listing) -> Listing:
        """``listing`` narrowed to the subset's files, at the same revision. Called by
        :func:`~firstlight.sources._cache.fetch_once` under the fetch's lock.

        Raises :class:`ModelSourceError` naming the required files the source lacks.
        """
        files = {p: size for p, size in listing.files.items() if _any_match(p, self.patterns)}
        missing = [" or ".join(group) for group in self.required if not _found(files, group)]
        if missing:
            raise ModelSourceError(
                f"model {model!r}: {label} has no {'; no '.join(missing)} at its top level, "
                f"which the gateway needs to load the model's {self.name} (the source must "
                "hold a model folder as transformers' save_pretrained writes it)"
            )
        return Listing(files, listing.revision)


def _found(files: dict[str, int], group: tuple[str, ...]) -> bool:
    return any(_any_match(path, group) for path in files)


def _any_match(path: str, patterns: tuple[str, ...]) -> bool:
    parts = path.split("/")
    for pattern in patterns:
        wanted = pattern.split("/")
        if len(wanted) == len(parts) and all(map(fnmatchcase, parts, wanted)):
            return True
    return False


TOKENIZER_FILES = Subset(
    name="tokenizer",
    # What transformers 5's AutoTokenizer.from_pretrained reads from a folder, and the
    # gateway's encoder (firstlight.api.prompts.HfPromptEncoder) besides:
    #  - config.json: AutoConfig, to pick the tokenizer class from the model type; the
    #    encoder reads vocab_size from it;
    #  - tokenizer_config.json, tokenizer.json (or a versioned tokenizer.<v>.json its
    #    fast_tokenizer_files names), special_tokens_map.json, added_tokens.json;
    #  - the vocabularies tokenizer classes name (vocab_files_names): vocab.json,
    #    merges.txt, vocab.txt, dict.txt, entity_vocab.json, ...; SentencePiece and
    #    tiktoken models (tokenizer.model, spiece.model, sentencepiece.bpe.model,
    #    tiktoken.model, Marian's source.spm), BPE codes; Mistral's tekken.json or
    #    tokenizer.model.v3 (mistral_common);
    #  - chat_template.jinja and additional_chat_templates/*.jinja.
    # Top-level JSON and text files are small next to the weights, and taking them all
    # covers vocabularies with names of their own; weights are never among them.
    patterns=(
        "*.json",
        "*.txt",
        "*.model",
        "*.model.v*",
        "*.spm",
        "bpe.codes",
        "*.jinja",
        "additional_chat_templates/*.jinja",
    ),
    required=(
        ("config.json",),
        ("tokenizer_config.json",),
        (
            "tokenizer.json",
            "tokenizer.*.json",
            "vocab.json",
            "vocab.txt",
            "tekken.json",
            "*.model",
            "*.model.v*",
        ),
    ),
)
"""The files the gateway loads a model's tokenizer and chat template from."""
