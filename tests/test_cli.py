"""The CLI through typer's runner and as a real subprocess of the installed script."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from firstlight.cli import app
from firstlight.config import load_config
from tests.conftest import REPO_ROOT, VENV_BIN

runner = CliRunner()
LOCAL = REPO_ROOT / "examples" / "local-two-regions.yaml"
BAD = "router: {policy: fastest}\nmodels:\n  - {name: m, replicas: -4}\n"
BAD_PEER = "regions:\n  - name: us-east\n    peers: [{region: mars, rtt_ms: 5}]\n"


def test_help_lists_only_working_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("version", "prepare-model", "config"):
        assert command in result.stdout
    config_help = runner.invoke(app, ["config", "--help"])
    assert "validate" in config_help.stdout
    assert "reference" in config_help.stdout


def test_version_matches_the_installed_distribution() -> None:
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"firstlight {version('firstlight')}"


def test_validate_prints_the_resolved_config_as_yaml() -> None:
    result = runner.invoke(app, ["config", "validate", str(LOCAL)])
    assert result.exit_code == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed == load_config(LOCAL, environ={}).model_dump(mode="json")
    assert "valid:" in result.stderr
    assert "regions us-east, eu-west" in result.stderr


def test_validate_prints_json_on_request() -> None:
    result = runner.invoke(app, ["config", "validate", str(LOCAL), "--output", "json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["router"]["policy"] == "firstlight"


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_validate_masks_credentials_in_urls(output: str) -> None:
    """The hole: ``config validate`` printed a ``redis_url`` holding a password."""
    env = {"FIRSTLIGHT__HINTS__REDIS_URL": "rediss://hints:s3cret-pw@redis.internal:6380/2"}
    result = runner.invoke(app, ["config", "validate", str(LOCAL), "-o", output], env=env)
    assert result.exit_code == 0, result.stderr
    assert "s3cret-pw" not in result.stdout
    assert "//hints:" not in result.stdout  # the user name too
    assert "rediss://***@redis.internal:6380/2" in result.stdout


def test_validate_applies_environment_overrides() -> None:
    env = {"FIRSTLIGHT__ROUTER__POLICY": "power_of_two"}
    result = runner.invoke(app, ["config", "validate", str(LOCAL), "-o", "json"], env=env)
    assert result.exit_code == 0
    assert json.loads(result.stdout)["router"]["policy"] == "power_of_two"


def test_validate_reports_every_problem_with_exit_code_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    result = runner.invoke(app, ["config", "validate", str(bad)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "router.policy = 'fastest': Input should be 'firstlight'" in result.stderr
    assert "models[0].replicas = -4: Input should be greater than or equal to 1" in result.stderr


def test_validate_reports_cross_field_problems(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_PEER)
    result = runner.invoke(app, ["config", "validate", str(bad)])
    assert result.exit_code == 2
    assert "regions[0].peers[0].region = 'mars': unknown region; known regions: us-east" in (
        result.stderr
    )


def test_validate_of_malformed_yaml_and_missing_files_exits_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("router: {policy: [\n")
    for path, fragment in (
        (broken, "malformed YAML at line"),
        (tmp_path / "no.yaml", "cannot read"),
    ):
        result = runner.invoke(app, ["config", "validate", str(path)])
        assert result.exit_code == 2
        assert fragment in result.stderr


def test_reference_documents_each_field() -> None:
    result = runner.invoke(app, ["config", "reference"])
    assert result.exit_code == 0
    assert "| `router.policy` |" in result.stdout
    assert "| `regions[].peers[].rtt_ms` | number (≥ 0, ≤ 10000) |" in result.stdout


def test_installed_script_rejects_bad_config_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    done = subprocess.run(
        [VENV_BIN / "firstlight", "config", "validate", bad], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "models[0].replicas = -4" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_module_entry_point_validates_the_local_example() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "firstlight", "config", "validate", LOCAL],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["regions"][1]["name"] == "eu-west"


def test_bench_is_mounted_from_its_entry_point() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    assert "sim" in result.output
    assert "int8-dtypes" in result.output


def test_a_plugin_whose_dependencies_are_missing_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    import typer

    from firstlight import cli

    broken = importlib.metadata.EntryPoint(
        "bench", "firstlight_tests_missing_module:app", "firstlight.commands"
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [broken])
    parent = typer.Typer()
    parent.command("version")(lambda: None)
    cli._mount_plugins(parent)
    result = CliRunner().invoke(parent, ["bench"])
    assert result.exit_code == 1
    assert "`firstlight bench` needs firstlight_tests_missing_module" in result.output
    assert "pip install 'firstlight[bench]'" in result.output


def test_up_names_a_model_whose_folder_is_missing_before_starting_anything(
    tmp_path: Path,
) -> None:
    config = tmp_path / "broken.yaml"
    missing = tmp_path / "no-such-model"
    config.write_text(
        f"regions: [{{name: here}}]\nmodels: [{{name: broken, source: {missing}, engine: vllm}}]\n"
    )
    result = runner.invoke(app, ["up", "--config", str(config)])
    assert result.exit_code == 1
    assert "model 'broken': no model folder at" in result.output
    assert str(missing) in result.output.replace("\n", "")
    assert "Traceback" not in result.output


def test_up_names_a_misspelt_vllm_engine_argument_before_starting_anything(
    tmp_path: Path,
) -> None:
    """A model folder that exists (a config.json is all the check reads), and an engine
    argument vLLM does not have: refused naming the key, with vLLM's closest name."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = tmp_path / "misspelt.yaml"
    config.write_text(
        "regions: [{name: here}]\n"
        f"models: [{{name: m, source: {model}, engine: vllm,"
        " vllm: {engine_args: {max_logprob: 5}}}]\n"
    )
    result = runner.invoke(app, ["up", "--config", str(config)])
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert "vllm.engine_args.max_logprob = 5" in output
    assert "did you mean max_logprobs" in output
    assert "Traceback" not in result.output
