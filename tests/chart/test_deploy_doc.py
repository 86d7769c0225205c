"""docs/deploy.md stays true: every ``firstlight`` command on it is parsed by the real CLI
(unknown commands or options fail), those that can run offline are run, the values
files and chart it names exist and render, and the commands' outputs chain as the page
says (``to-helm-values`` output installs)."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from firstlight.cli import app
from tests.chart.chart import CHART_DIR, REPO, render

DOC = REPO / "docs" / "deploy.md"
RUNNABLE_OFFLINE = {("config", "validate"), ("config", "to-helm-values")}
"""Commands that need no cluster or endpoint; the others (status, check) are covered by
tests/k8s/test_status.py and tests/chart/test_serve_config.py."""


def _shell_lines() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip()]


def _firstlight_commands() -> list[list[str]]:
    commands = []
    for line in _shell_lines():
        if line.startswith("firstlight "):
            words = shlex.split(line.split(" > ")[0])
            commands.append(words[1:])
    return commands


def _parse(args: list[str]) -> tuple[str, ...]:
    """Parse ``args`` with the real CLI down to the leaf command (raising its usage error
    for an unknown command or option); return the command's path."""
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("firstlight", list(args))
    path: list[str] = []
    while hasattr(command, "resolve_command"):  # a group: descend into the subcommand
        # The group's parser keeps the subcommand's name apart from its arguments.
        name, command, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx)
    return tuple(path)


def test_parsing_rejects_what_the_cli_would() -> None:
    assert _parse(["status", "--output", "json"]) == ("status",)
    with pytest.raises(Exception, match="No such option"):
        _parse(["status", "--no-such-option"])
    with pytest.raises(Exception, match="No such command"):
        _parse(["config", "no-such-command"])


def test_the_page_names_the_commands_an_operator_needs() -> None:
    paths = {_parse(args) for args in _firstlight_commands()}
    assert {("status",), ("check",), ("config", "to-helm-values"), ("config", "validate")} <= paths


@pytest.mark.parametrize("args", _firstlight_commands(), ids=" ".join)
def test_every_firstlight_command_parses_and_runs_where_it_can(args: list[str]) -> None:
    path = _parse(args)
    if path not in RUNNABLE_OFFLINE:
        return
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_helm_commands_name_the_chart_and_existing_values() -> None:
    lines = [line for line in _shell_lines() if line.startswith("helm install firstlight ")]
    assert lines
    # The page writes us-east.values.yaml with to-helm-values just before installing it.
    (to_values,) = [a for a in _firstlight_commands() if a[:2] == ["config", "to-helm-values"]]
    generated = yaml.safe_load(CliRunner().invoke(app, to_values).stdout)
    for line in lines:
        words = shlex.split(line)
        assert (REPO / words[3]).resolve() == CHART_DIR
        assert words[words.index("-f") + 1] == "us-east.values.yaml"
        render(generated)


def test_linked_files_exist() -> None:
    text = DOC.read_text(encoding="utf-8")
    for target in re.findall(r"\]\((\.\./[^)#]+)\)", text):
        assert (DOC.parent / target).exists(), target
    # Every values file the page names in backquotes is an example that exists
    # (us-east.values.yaml is both: the example, and what to-helm-values writes).
    for name in re.findall(r"`([\w-]+\.values\.yaml)`", text):
        assert (REPO / "examples" / "helm" / name).is_file(), name
