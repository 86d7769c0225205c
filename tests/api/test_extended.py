"""Which requests the gateway serves itself (``firstlight.api.extended``): every field
outside its subset is found, by path, and the routed view keeps only what it parses."""

from __future__ import annotations

from typing import Any

import pytest

from firstlight.api.extended import NATIVE_FIELDS, extended_fields, routed_view
from firstlight.api.schemas import ChatCompletionRequest, CompletionRequest

USER = {"role": "user", "content": "hi"}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **fields}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (_chat(), ()),
        (_chat(temperature=0, top_p=0.5, seed=1, stop=["x"], stream=True, user="u"), ()),
        (_chat(stream_options={"include_usage": True}, max_completion_tokens=3), ()),
        (_chat(n=1), ("n",)),
        (
            _chat(response_format={"type": "json_object"}, logprobs=True),
            ("response_format", "logprobs"),
        ),
        (
            _chat(stream_options={"continuous_usage_stats": True}),
            ("stream_options.continuous_usage_stats",),
        ),
        (
            _chat(messages=[USER, {"role": "assistant", "content": None, "tool_calls": []}]),
            ("messages.1.tool_calls",),
        ),
        (
            _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            ("messages.0.content.0",),
        ),
        (_chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}]}]), ()),
    ],
    ids=[
        "plain",
        "every-native",
        "usage",
        "n",
        "two",
        "stream-option",
        "tool-calls",
        "image",
        "text-part",
    ],
)
def test_chat_fields_outside_the_subset_are_found_by_path(
    body: dict[str, Any], expected: tuple[str, ...]
) -> None:
    assert extended_fields("chat", body) == expected


def test_completion_fields_outside_the_subset() -> None:
    body = {"model": "m", "prompt": "p", "echo": True, "max_tokens": 3, "suffix": "s"}
    assert extended_fields("text", body) == ("echo", "suffix")
    assert extended_fields("text", {"model": "m", "prompt": "p", "messages": []}) == ("messages",)


def test_the_native_subset_is_what_the_gateways_schemas_define() -> None:
    # A field in NATIVE_FIELDS that the schema did not define would be refused as extra;
    # a schema field missing from it would send every request using it to vLLM's layer.
    assert NATIVE_FIELDS["chat"] == set(ChatCompletionRequest.model_fields)
    assert NATIVE_FIELDS["text"] == set(CompletionRequest.model_fields)


def test_the_routed_view_validates_against_the_gateways_own_schema() -> None:
    body = _chat(
        messages=[
            {"role": "system", "content": "s", "cache_control": {}},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "tool", "content": "42", "tool_call_id": "1"},
        ],
        tools=[{"type": "function", "function": {"name": "f"}}],
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        logprobs=True,
        max_tokens=9,
    )
    view = ChatCompletionRequest.model_validate(routed_view("chat", body))
    assert [m.role for m in view.messages] == ["system", "user", "assistant", "tool"]
    assert [m.text() for m in view.messages] == ["s", "a", "", "42"]
    assert view.stream
    assert view.include_usage
    assert view.requested_max_tokens == 9
    assert "tools" in body  # the body itself is untouched: the replica gets it whole
