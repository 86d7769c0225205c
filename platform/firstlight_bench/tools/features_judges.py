"""The judges of ``firstlight bench features``: pure functions from the answers a server
gave to a :class:`Verdict` (honoured or not, and the evidence in a few words).

Who calls what: each check in :mod:`firstlight_bench.tools.features` sends its requests with
the official ``openai`` client and hands the parsed answers (``ChatCompletion``,
``Completion``, ``Model``) to one judge here; the tests call the judges on canned
answers. No judge raises on a malformed answer: a missing field is evidence too.
:func:`is_json_prefix` is the JSON-mode judge's check of an answer cut at ``max_tokens``
(a small model in JSON mode can nest without end: the output is then a valid *prefix*).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionMessageFunctionToolCall

__all__ = [
    "Verdict",
    "is_json_prefix",
    "judge_echo",
    "judge_json_object",
    "judge_json_schema",
    "judge_logit_bias",
    "judge_logprobs",
    "judge_min_tokens",
    "judge_model_object",
    "judge_n",
    "judge_named_tool",
    "judge_sampling",
    "judge_seed",
    "judge_stop",
    "pick_stop_word",
    "short",
]

_EVIDENCE_CHARS = 60
_JSON_KINDS = {
    "str": "string",
    "list": "array",
    "int": "number",
    "float": "number",
    "bool": "boolean",
    "NoneType": "null",
}


@dataclass(frozen=True)
class Verdict:
    """Whether the answers prove the field had its effect, and the evidence."""

    honoured: bool
    evidence: str


def short(text: str, limit: int = _EVIDENCE_CHARS) -> str:
    """``text`` for evidence: its whitespace runs made single spaces, cut to ``limit``
    characters (with an ellipsis), in double quotes."""
    flat = " ".join(text.split())
    return f'"{flat}"' if len(flat) <= limit else f'"{flat[: limit - 1]}…"'


def _content(completion: ChatCompletion, index: int = 0) -> str:
    if len(completion.choices) <= index:
        return ""
    return completion.choices[index].message.content or ""


def _finish(completion: ChatCompletion) -> str | None:
    return completion.choices[0].finish_reason if completion.choices else None


def judge_json_schema(completion: ChatCompletion, schema: Mapping[str, Any]) -> Verdict:
    """Honoured when the answer parses as JSON and validates against ``schema``."""
    text = _content(completion)
    try:
        value = json.loads(text)
    except ValueError:
        return Verdict(False, f"not JSON: {short(text)}")
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return Verdict(False, f"JSON against the schema: {short(exc.message)}")
    return Verdict(True, f"matches the schema: {short(text)}")


def judge_json_object(completion: ChatCompletion) -> Verdict:
    """Honoured when the answer is a JSON value, or, cut at ``max_tokens``
    (``finish_reason == "length"``), a valid JSON prefix; an empty answer is not."""
    text = _content(completion)
    if not text.strip():
        return Verdict(False, "empty answer")
    try:
        json.loads(text)
    except ValueError:
        pass
    else:
        return Verdict(True, f"valid JSON: {short(text)}")
    if _finish(completion) == "length" and is_json_prefix(text):
        return Verdict(True, f"a valid JSON prefix, cut at max_tokens: {short(text)}")
    return Verdict(False, f"not JSON (finish_reason {_finish(completion)}): {short(text)}")


def judge_named_tool(
    completion: ChatCompletion, name: str, parameters: Mapping[str, Any]
) -> Verdict:
    """Honoured when a call to the tool ``name`` comes back and its ``arguments`` parse
    as JSON that validates against the tool's ``parameters`` schema."""
    message = completion.choices[0].message if completion.choices else None
    calls = (message.tool_calls or []) if message is not None else []
    functions = [c.function for c in calls if isinstance(c, ChatCompletionMessageFunctionToolCall)]
    if not functions:
        text = message.content if message is not None else ""
        return Verdict(False, f"no tool call; content {short(text or '')}")
    call = functions[0]
    if call.name != name:
        return Verdict(False, f"called {call.name!r}, not {name!r}")
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        return Verdict(False, f"arguments are not JSON: {short(call.arguments)}")
    if not isinstance(arguments, dict):
        kind = _JSON_KINDS.get(type(arguments).__name__, "value")
        return Verdict(False, f"arguments are a JSON {kind}, not an object: {call.arguments[:40]}")
    try:
        jsonschema.validate(arguments, parameters)
    except jsonschema.ValidationError as exc:
        return Verdict(False, f"arguments against the schema: {short(exc.message)}")
    return Verdict(True, f"{name}({short(call.arguments)})")


def judge_logprobs(completion: ChatCompletion, top: int) -> Verdict:
    """Honoured when the answer has token logprobs and every content token carries a
    logprob and exactly ``top`` alternatives."""
    logprobs = completion.choices[0].logprobs if completion.choices else None
    tokens = logprobs.content if logprobs is not None else None
    if not tokens:
        return Verdict(False, "no token logprobs in the answer")
    for i, token in enumerate(tokens):
        if not isinstance(token.logprob, float | int):
            return Verdict(False, f"token {i} ({short(token.token)}) has no logprob")
        if len(token.top_logprobs or []) != top:
            count = len(token.top_logprobs or [])
            return Verdict(False, f"token {i} has {count} alternatives, not {top}")
    first = tokens[0]
    return Verdict(
        True,
        f"{len(tokens)} tokens, each with {top} alternatives; first {short(first.token)} "
        f"at {first.logprob:.2f}",
    )


def judge_n(completion: ChatCompletion, n: int) -> Verdict:
    """Honoured when the answer has ``n`` choices with indexes ``0 .. n-1``."""
    indexes = sorted(c.index for c in completion.choices)
    if indexes != list(range(n)):
        return Verdict(False, f"choices with indexes {indexes}")
    same = len({_content(completion, i) for i in range(n)}) == 1
    return Verdict(True, f"{n} choices, indexes {indexes}" + (" (same text)" if same else ""))


def judge_seed(first: ChatCompletion, again: ChatCompletion, other: ChatCompletion) -> Verdict:
    """Honoured when two sampled answers with the same seed are the same text; whether
    a different seed gave another text is said, not judged (it may not, by chance)."""
    a, b, c = _content(first), _content(again), _content(other)
    if not a:
        return Verdict(False, "empty answer")
    if a != b:
        return Verdict(False, f"the same seed gave {short(a, 30)} then {short(b, 30)}")
    differs = "another seed differs" if c != a else "another seed gave the same text"
    return Verdict(True, f"the same text twice ({len(a)} chars); {differs}")


_WORD = re.compile(r"[A-Za-z]{4,}")


def pick_stop_word(text: str) -> str | None:
    """A word of at least four letters in ``text`` after its first 10 characters (so a
    stop there leaves something before it), to use as the stop string; ``None`` if
    there is none."""
    for match in _WORD.finditer(text):
        if match.start() >= 10:
            return match.group()
    return None


def judge_stop(free: ChatCompletion, stopped: ChatCompletion, stop: str) -> Verdict:
    """Honoured when the answer without ``stop`` contained it and the answer with it
    does not, and ended with ``finish_reason == "stop"``."""
    before, after = _content(free), _content(stopped)
    if stop not in before:
        return Verdict(False, f"{stop!r} not in the unconstrained answer: inconclusive")
    if stop in after:
        return Verdict(False, f"{stop!r} still in {short(after)}")
    if _finish(stopped) != "stop":
        return Verdict(False, f"finish_reason {_finish(stopped)}, not stop")
    return Verdict(True, f"cut before {stop!r}: {short(after, 40)}")


def judge_min_tokens(free: ChatCompletion, forced: ChatCompletion, min_tokens: int) -> Verdict:
    """Honoured when the unconstrained answer was shorter than ``min_tokens`` (it ended
    by itself) and the answer with ``min_tokens`` has at least that many tokens."""
    if free.usage is None or forced.usage is None:
        return Verdict(False, "no usage in the answers")
    base, got = free.usage.completion_tokens, forced.usage.completion_tokens
    if base >= min_tokens or _finish(free) != "stop":
        return Verdict(False, f"unconstrained answer already {base} tokens: inconclusive")
    if got < min_tokens:
        return Verdict(False, f"{got} tokens with min_tokens={min_tokens} (unconstrained {base})")
    return Verdict(True, f"{got} tokens with min_tokens={min_tokens}, {base} without")


def judge_sampling(
    greedy: ChatCompletion,
    top_k_one: ChatCompletion,
    repetitive: ChatCompletion,
    penalised: ChatCompletion,
) -> Verdict:
    """Honoured when ``top_k=1`` at temperature 1.0 gave the greedy (temperature 0)
    answer and a large ``repetition_penalty`` changed a greedy repetitive answer."""
    g, k = _content(greedy), _content(top_k_one)
    r, p = _content(repetitive), _content(penalised)
    top_k_ok = bool(g) and g == k
    penalty_ok = bool(r) and r != p
    parts = [
        "top_k=1 at T=1 gave the greedy answer" if top_k_ok else "top_k=1 at T=1 differs",
        "repetition_penalty changed the answer" if penalty_ok else "repetition_penalty no effect",
    ]
    return Verdict(top_k_ok and penalty_ok, "; ".join(parts))


def judge_model_object(model: Model, model_id: str) -> Verdict:
    """Honoured when ``GET /v1/models/{id}`` returned a model object with that id."""
    if model.id != model_id:
        return Verdict(False, f"returned id {model.id!r}")
    return Verdict(True, f"id {model.id!r}, object {model.object!r}")


def judge_logit_bias(completion: ChatCompletion, piece: str) -> Verdict:
    """Honoured when the answer is nothing but repetitions of the biased token's text
    ``piece`` (whitespace aside)."""
    text = _content(completion)
    word = piece.strip()
    if not word or not text.strip() or text.replace(word, "").strip():
        return Verdict(False, f"answer {short(text)} is not only {piece!r}")
    return Verdict(True, f"{text.count(word)} times {piece!r}")


def judge_echo(completion: Completion, prompt: str) -> Verdict:
    """Honoured when the completion's text starts with the prompt."""
    text = completion.choices[0].text if completion.choices else ""
    if not text.startswith(prompt):
        return Verdict(False, f"text starts {short(text[: len(prompt) + 10])}")
    return Verdict(True, f"prompt + {short(text[len(prompt) :], 40)}")


# The JSON-prefix checker: a pushdown automaton over characters (RFC 8259).
_WHITESPACE = " \t\n\r"
_ESCAPES = '"\\/bfnrt'
_HEX = "0123456789abcdefABCDEF"
_LITERALS = {"t": "true", "f": "false", "n": "null"}
# The number automaton: state -> {character class: next state}; complete states end it.
_NUMBER_STEPS: dict[str, dict[str, str]] = {
    "start": {"-": "minus", "0": "zero", "1": "int"},
    "minus": {"0": "zero", "1": "int"},
    "zero": {".": "dot", "e": "e"},
    "int": {"0": "int", "1": "int", ".": "dot", "e": "e"},
    "dot": {"0": "frac", "1": "frac"},
    "frac": {"0": "frac", "1": "frac", "e": "e"},
    "e": {"+": "sign", "-": "sign", "0": "exp", "1": "exp"},
    "sign": {"0": "exp", "1": "exp"},
    "exp": {"0": "exp", "1": "exp"},
}
_NUMBER_COMPLETE = frozenset({"zero", "int", "frac", "exp"})


def _number_class(char: str) -> str:
    if char == "0":
        return "0"
    if char in "123456789":
        return "1"
    return "e" if char in "eE" else char


def is_json_prefix(text: str) -> bool:
    """True when ``text`` can be extended to a valid JSON text (RFC 8259), including
    when it already is one (and for the empty string). Called by
    :func:`judge_json_object` on an answer cut at ``max_tokens``."""
    stack: list[str] = []  # "{" or "[" for each open container
    expect = "value"  # value, value_or_close, key, key_or_close, colon, comma_or_close, done
    token = ""  # "string", "key", "number", "literal" while inside one
    state = ""  # the token's own state: number state, literal so far, string escape state
    i = 0
    while i < len(text):
        char = text[i]
        if token in ("string", "key"):
            if state == "":
                if char == '"':
                    expect = "colon" if token == "key" else _after_value(stack)
                    token = ""
                elif char == "\\":
                    state = "escape"
                elif ord(char) < 0x20:
                    return False
            elif state == "escape":
                if char == "u":
                    state = "u0"
                elif char in _ESCAPES:
                    state = ""
                else:
                    return False
            else:  # "uN": N hex digits of a \\u escape read so far
                if char not in _HEX:
                    return False
                read = int(state[1]) + 1
                state = "" if read == 4 else f"u{read}"
            i += 1
            continue
        if token == "number":
            step = _NUMBER_STEPS[state].get(_number_class(char))
            if step is not None:
                state = step
                i += 1
                continue
            if state not in _NUMBER_COMPLETE:
                return False
            token, expect = "", _after_value(stack)  # the character is read again below
        if token == "literal":
            word = _LITERALS[state[0]]
            if char != word[len(state)]:
                return False
            state += char
            if state == word:
                token, expect = "", _after_value(stack)
            i += 1
            continue
        if char in _WHITESPACE:
            i += 1
            continue
        result = _structural(char, stack, expect)
        if result is None:
            return False
        expect, token, state = result
        i += 1
    return True


def _after_value(stack: list[str]) -> str:
    return "comma_or_close" if stack else "done"


def _structural(char: str, stack: list[str], expect: str) -> tuple[str, str, str] | None:
    """The next ``(expect, token, state)`` after a structural character read while
    expecting ``expect``; ``None`` when the character cannot come there."""
    if expect in ("value", "value_or_close"):
        if char == "]" and expect == "value_or_close":
            stack.pop()
            return _after_value(stack), "", ""
        if char in "{[":
            stack.append(char)
            return ("key_or_close" if char == "{" else "value_or_close"), "", ""
        if char == '"':
            return "value", "string", ""
        if char == "-" or (char.isascii() and char.isdigit()):
            return "", "number", _NUMBER_STEPS["start"][_number_class(char)]
        if char in _LITERALS:
            return "", "literal", char
        return None
    if expect in ("key", "key_or_close"):
        if char == '"':
            return "key", "key", ""
        if char == "}" and expect == "key_or_close":
            stack.pop()
            return _after_value(stack), "", ""
        return None
    if expect == "colon":
        return ("value", "", "") if char == ":" else None
    if expect == "comma_or_close":
        if char == ",":
            return ("key" if stack[-1] == "{" else "value"), "", ""
        if char == ("}" if stack[-1] == "{" else "]"):
            stack.pop()
            return _after_value(stack), "", ""
    return None
