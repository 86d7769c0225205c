"""The engine benchmark's report (run on the simulator, which has no engine processes of
its own), the idle-CPU section of docs/serving.md and the engine and quantization tables
of docs/engines.md, held to the stored reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from firstlight_bench.tools.engine import IDLE_BEGIN, IDLE_END, emit, render_idle
from firstlight_bench.tools.engine_table import (
    COMPARE_BEGIN,
    COMPARE_END,
    QUANT_BEGIN,
    QUANT_END,
    render_compare,
    render_quantization,
)
from tests.bench.bench_cli import run_bench
from tests.bench.pages import shown_section

REPO = Path(__file__).parents[2]
STORED = REPO / "docs" / "benchmarks" / "engine-idle" / "results.json"


@pytest.mark.slow
def test_a_run_stores_its_report_and_rewrites_the_idle_section(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"before\n{IDLE_BEGIN}\nold\n{IDLE_END}\nafter\n")
    out = tmp_path / "results.json"
    argv = ["--engine", "sim", "--repeats", "1", "--prompt-tokens", "64"]
    argv += ["--cached-tokens", "32", "--output-tokens", "2", "--concurrency", "1"]
    result = run_bench("engine", *argv, "--out", str(out), "--page", str(page))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert json.loads(result.stdout) == report
    assert report["meta"]["command"].startswith("firstlight bench engine --engine sim")
    assert report["meta"]["command"].endswith("--page " + str(page))
    assert report["meta"]["options"] == {
        "engine": "sim", "prompt_tokens": 64, "cached_tokens": 32, "output_tokens": 2,
        "concurrency": 1, "repeats": 1, "seed": 0, "dtype": None,
    }  # fmt: skip
    # The simulator runs in this process: no engine process burns anything once idle.
    assert report["idle_cpu_cores"] == {"0-1s": 0.0, "1-2s": 0.0, "2-5s": 0.0}
    text = page.read_text()
    assert text.startswith("before\n" + IDLE_BEGIN)
    assert text.endswith(IDLE_END + "\nafter\n")
    assert "| 0.00 | 0.00 | 0.00 |" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--page", "x.md"], "--page needs --out"),
        (["--cached-tokens", "65", "--prompt-tokens", "64"], "--cached-tokens: 65 is more"),
        (["--repeats", "0"], "'--repeats'"),
        (["--dtype", "int4"], "'--dtype'"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("engine", "--engine", "sim", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


def test_an_unknown_engine_is_refused_by_name() -> None:
    result = run_bench("engine", "--engine", "tpu")
    assert result.exit_code == 2
    assert "'--engine'" in result.stderr


def test_the_serving_page_shows_exactly_the_stored_idle_report() -> None:
    page = (REPO / "docs" / "serving.md").read_text()
    shown = shown_section(page, IDLE_BEGIN, IDLE_END)
    report = json.loads(STORED.read_text())
    assert shown == render_idle(report), "docs/serving.md is stale: rerun the command it names"
    assert report["meta"]["engine"] == "vllm"
    assert not report["meta"]["git_commit"].endswith("-dirty")


def test_emit_creates_the_folder_it_stores_into(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "not-yet" / "results.json"
    emit({"meta": {"command": "x"}}, out)
    assert json.loads(out.read_text()) == {"meta": {"command": "x"}}
    assert '"command": "x"' in capsys.readouterr().out


def _engine_run(engine: str, cold: float, cached: float) -> dict[str, Any]:
    options = {"engine": engine, "prompt_tokens": 1000, "cached_tokens": 900}
    options |= {"output_tokens": 64, "concurrency": 4, "repeats": 10, "seed": 0}
    options |= {"dtype": "float32"}
    return {
        "meta": {
            "command": f"firstlight bench engine --engine {engine}",
            "git_commit": "0123456789abcdef",
            "engine": engine,
            "model": "SmolLM2-135M-Instruct",
            "cpu_count": 2,
            "options": options,
        },
        "startup_s": 24.94,
        "peak_rss_mib": 3532,
        "ttft_ms": {
            "cold": {"p50": cold, "p90": cold},
            "cached": {"p50": cached, "p90": cached},
            "cached_over_cold": round(cached / cold, 3),
        },
        "decode": {"tokens_per_s_total": 92.34, "tokens_per_s_per_request": 23.08},
    }


def test_the_engine_table_puts_the_real_engine_beside_the_simulator() -> None:
    section = render_compare(_engine_run("vllm", 1864.2, 259.0), _engine_run("sim", 1733, 264))
    assert section.startswith(COMPARE_BEGIN + "\n")
    assert section.endswith("\n" + COMPARE_END)
    assert "(SmolLM2-135M-Instruct in float32, a CPU with 2 cores;" in section
    assert "| TTFT, 1,000 tokens cold, p50 | 1,864 ms | 1,733 ms |" in section
    assert "| TTFT, 900 of 1,000 cached, p50 | 259 ms | 264 ms |" in section
    assert "| cached / cold | **0.139** | **0.152** |" in section
    assert "92.3 / 23.1 tokens/s" in section
    assert "takes 86% off the real engine's TTFT (85% simulated)" in section


def test_the_engine_table_refuses_runs_that_do_not_compare() -> None:
    real, sim = _engine_run("vllm", 1864, 259), _engine_run("sim", 1733, 264)
    sim["meta"]["options"]["prompt_tokens"] = 512
    with pytest.raises(ValueError, match="different options"):
        render_compare(real, sim)
    with pytest.raises(ValueError, match="vllm's"):
        render_compare(sim, real)


def _quantization_run() -> dict[str, Any]:
    return {
        "meta": {
            "command": "firstlight bench quantization",
            "git_commit": "ab" * 20,
            "cpu": "a CPU",
        },
        "reference": {
            "dtype": "float32",
            "ttft_ms_p50": 382.0,
            "decode_tokens_per_s": 174.2,
            "peak_rss_mib": 3527,
        }
        | {"startup_s": 25.0},
        "int8_w8a8": {
            "dtype": "bfloat16",
            "ttft_ms_p50": 252.0,
            "decode_tokens_per_s": 219.4,
            "peak_rss_mib": 3622,
        }
        | {"startup_s": 21.0}
        | {
            "agreement_with_reference": {
                "prompts": 20,
                "exact": 4,
                "mean_common_prefix_tokens": 9.4,
                "mean_answer_tokens": 25.4,
            }
        },
    }


def test_the_quantization_table_shows_both_models_of_one_run(tmp_path: Path) -> None:
    report = _quantization_run()
    report["meta"]["cpu_count"] = 2
    section = render_quantization(report)
    assert (
        "| TTFT, 256-token prompt, p50 | 382 ms | **252 ms** (1.52x the reference's speed) |"
        in section
    )
    assert "**219 tokens/s** (1.26x)" in section
    assert "| | unquantized, float32 | INT8 W8A8 (data-free), bfloat16 activations |" in section
    assert (
        "| greedy answers equal to the reference's | — | 4 of 20; mean common prefix 9.4 of 25.4"
        in section
    )
    # The tool rewrites both sections of a page from the files it is given.
    files = {}
    for name, run in {
        "real": _engine_run("vllm", 1864, 259),
        "sim": _engine_run("sim", 1733, 264),
        "quantization": report,
    }.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(run))
    page = tmp_path / "engines.md"
    page.write_text(
        f"a\n{COMPARE_BEGIN}\nstale\n{COMPARE_END}\nb\n{QUANT_BEGIN}\nstale\n{QUANT_END}\n"
    )
    args = [f"--{k}={v}" for k, v in files.items()] + [f"--page={page}"]
    result = run_bench("engine-table", *args)
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert "stale" not in text
    assert text.startswith(f"a\n{COMPARE_BEGIN}")
    assert text.endswith(f"{QUANT_END}\n")
    assert "| cached / cold | **0.139** | **0.152** |" in text
    assert "**252 ms**" in text
    # Runs that do not compare, or a page without the sections, are refused by name.
    swapped = [f"--real={files['sim']}", f"--sim={files['real']}", *args[2:]]
    result = run_bench("engine-table", *swapped)
    assert result.exit_code == 2
    assert "'--real' / '--sim'" in result.stderr
    assert "vllm's" in result.stderr
    page.write_text("no sections\n")
    result = run_bench("engine-table", *args)
    assert result.exit_code == 2
    assert "Invalid value for --page: the page has no" in result.stderr
    assert page.read_text() == "no sections\n"
    result = run_bench("engine-table", *args[1:])
    assert result.exit_code == 2
    assert "'--real'" in result.stderr


def test_the_engines_page_shows_exactly_the_stored_runs() -> None:
    stored = REPO / "docs" / "benchmarks"
    real = json.loads((stored / "engine-vllm-cpu" / "results.json").read_text())
    sim = json.loads((stored / "engine-sim" / "results.json").read_text())
    quant = json.loads((stored / "quantization-vllm-cpu" / "results.json").read_text())
    page = (REPO / "docs" / "engines.md").read_text()
    assert shown_section(page, COMPARE_BEGIN, COMPARE_END) == render_compare(real, sim), (
        "docs/engines.md is stale: rerun the command it names"
    )
    assert shown_section(page, QUANT_BEGIN, QUANT_END) == render_quantization(quant)
    assert real["meta"]["simulated"] is False
    assert sim["meta"]["simulated"] is True
    for run in (real, sim, quant):
        assert not run["meta"]["git_commit"].endswith("-dirty")
