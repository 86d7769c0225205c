"""``firstlight bench int8-dtypes``'s command line: its one option, and a bad one refused
by name before any engine starts. (The runs themselves are stored under
docs/benchmarks/int8-dtypes/, one per kind of CPU, and summed up in docs/engines.md.)"""

from __future__ import annotations

import pytest

from tests.bench.bench_cli import run_bench


def test_help_lists_its_one_option() -> None:
    result = run_bench("int8-dtypes", "--help")
    assert result.exit_code == 0, result.output
    assert "--out" in result.stdout
    assert "Also write the JSON report to this file." in result.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out"], "'--out' requires an argument"),
        (["--dtype", "float16"], "No such option: --dtype"),
        (["extra"], "Got unexpected extra argument(s) (extra)"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("int8-dtypes", *argv)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
