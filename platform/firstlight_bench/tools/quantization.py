"""The unquantized model vs INT8 W8A8 on the same engine: TTFT, decode speed, memory,
answer agreement.

Run ``firstlight bench quantization`` (options: ``--repeats 10 --reference-dtype
float32|bfloat16 --out FILE``) after ``firstlight prepare-model --quantize int8``
(:mod:`firstlight_bench.tools.engine_table` makes the table of ``docs/engines.md`` from the
stored report). Each model gets its own engine, one after the other in
this process (peak RSS is measured per model, engine included). Prints JSON with
``meta`` and per model (``reference``: the unquantized model in ``--reference-dtype``,
float32 by default — bfloat16 answers garbage on CPUs with AMX, docs/engines.md;
``int8_w8a8``: in the dtype Firstlight resolves for this CPU), each with its ``dtype``:
``startup_s``, ``ttft_ms`` (a 256-token prompt, nothing cached, median of
``--repeats``), ``decode_tokens_per_s`` (8 concurrent requests of 64 greedy tokens),
``peak_rss_mib``, and for the INT8 model the agreement of its greedy answers with the
reference's on 20 fixed chat prompts: exact matches and mean common prefix in tokens.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from firstlight.config import HintsConfig, ModelConfig, load_config
from firstlight.engine.capabilities import detect_cpu_features, engine_dtype
from firstlight.engine.protocol import GenerationRequest, SamplingSettings
from firstlight.engine.vllm_engine import VllmEngine
from firstlight.prefix import HashScheme
from firstlight_bench.options import command_line
from firstlight_bench.reports.results import cpu_model, git_commit
from firstlight_bench.tools.engine import _PeakMemory, _tokens, _ttft_ms, chat_prompts, emit

__all__ = ["PROMPTS", "ReferenceDtype", "app"]

PROMPTS = (
    "What is the capital of France?", "Name three primary colors.", "What is 12 times 7?",
    "Write a haiku about autumn.", "Explain photosynthesis in one sentence.",
    "Who wrote Romeo and Juliet?", "Give me a synonym for happy.",
    "What is the boiling point of water?", "Translate 'good morning' into Spanish.",
    "List the planets of the solar system.", "What does a CPU do?",
    "Suggest a name for a pet goldfish.", "Why is the sky blue?",
    "How many legs does a spider have?", "Write one sentence about the ocean.",
    "What is the largest mammal?", "Give a tip for learning to code.", "What is gravity?",
    "Describe a cat in five words.", "What is the square root of 81?",
)  # fmt: skip


async def _answers(engine: VllmEngine, prompts: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    greedy = SamplingSettings(max_tokens=32)
    out = []
    for i, ids in enumerate(prompts):
        request = GenerationRequest(f"answer-{i}", ids, greedy)
        tokens = [t async for chunk in engine.generate(request) for t in chunk.token_ids]
        out.append(tuple(tokens))
    return out


async def _measure(
    engine: VllmEngine, prompts: list[tuple[int, ...]], repeats: int
) -> dict[str, Any]:
    rng = random.Random(0)
    one = SamplingSettings(max_tokens=1)
    await _ttft_ms(engine, GenerationRequest("warm-up", _tokens(rng, 32), one))
    ttft = [
        await _ttft_ms(engine, GenerationRequest(f"t{i}", _tokens(rng, 256), one))
        for i in range(repeats)
    ]
    decode = SamplingSettings(max_tokens=64)

    async def stream(i: int) -> int:
        request = GenerationRequest(f"d{i}", _tokens(rng, 32), decode)
        return sum([len(c.token_ids) async for c in engine.generate(request)])

    start = time.perf_counter()
    produced = sum(await asyncio.gather(*(stream(i) for i in range(8))))
    elapsed = time.perf_counter() - start
    return {
        "ttft_ms_p50": round(statistics.median(ttft), 1),
        "decode_tokens_per_s": round(produced / elapsed, 1),
        "answers": await _answers(engine, prompts),
    }


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class ReferenceDtype(StrEnum):
    """The dtype of the unquantized model the INT8 one is compared with (bfloat16 answers
    garbage on CPUs with AMX, docs/engines.md)."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


app = typer.Typer(add_completion=False)


@app.command()
def quantization(
    repeats: Annotated[
        int, typer.Option(min=1, help="TTFTs measured per model; their median.")
    ] = 10,
    reference_dtype: Annotated[
        ReferenceDtype,
        typer.Option(help="dtype of the unquantized model the INT8 one is compared with."),
    ] = ReferenceDtype.FLOAT32,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the JSON report to this file.")
    ] = None,
) -> None:
    """Measure the unquantized model, then INT8 W8A8, each on its own engine; print the
    JSON report (and write it to --out). Run for docs/engines.md's quantization table."""
    config = load_config()
    prompts = chat_prompts(config.default_model_dir, PROMPTS)
    variants = {
        "reference": ModelConfig(name="reference", kv_cache_gib=1, dtype=reference_dtype.value),
        "int8_w8a8": ModelConfig(
            name="int8",
            source="default-int8",
            quantization="compressed-tensors",
            kv_cache_gib=1,
            dtype="auto",  # what this processor's INT8 kernel answers right with
        ),
    }
    report: dict[str, Any] = {
        "meta": {
            "command": command_line(),
            "git_commit": git_commit(),
            "model": config.models[0].name,
            "python": sys.version.split()[0],
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
        }
    }
    cpu = detect_cpu_features()
    for name, model in variants.items():
        with _PeakMemory() as memory:
            start = time.perf_counter()
            scheme = HashScheme.for_model(model, HintsConfig())
            engine = VllmEngine.create(model, config.model_dir(model), scheme)
            startup_s = time.perf_counter() - start

            async def run(engine: VllmEngine = engine) -> dict[str, Any]:
                try:
                    return await _measure(engine, prompts, repeats)
                finally:
                    await engine.shutdown()

            measured = asyncio.run(run())
        report[name] = {
            "dtype": engine_dtype(model, "cpu", cpu),
            "startup_s": round(startup_s, 1),
            "peak_rss_mib": round(memory.peak_bytes / 2**20),
            **measured,
        }
    reference = report["reference"].pop("answers")
    candidate = report["int8_w8a8"].pop("answers")
    report["int8_w8a8"]["agreement_with_reference"] = {
        "prompts": len(reference),
        "exact": sum(a == b for a, b in zip(reference, candidate, strict=True)),
        "mean_common_prefix_tokens": round(
            statistics.mean(
                _common_prefix(a, b) for a, b in zip(reference, candidate, strict=True)
            ),
            1,
        ),
        "mean_answer_tokens": round(statistics.mean(len(a) for a in reference), 1),
    }
    emit(report, out)
