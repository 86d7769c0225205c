"""Engine fixtures: the default model, really converted once per test session."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import VENV_BIN

MODEL = "SmolLM2-135M-Instruct"

Prepared = tuple[Path, subprocess.CompletedProcess[str]]


def prepare_with_cli(cache_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run the installed ``firstlight prepare-model`` into ``cache_dir``."""
    command = [VENV_BIN / "firstlight", "prepare-model", "--cache-dir", cache_dir]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """Run the real CLI once per session into a fresh cache; return (folder, process)."""
    cache_dir = tmp_path_factory.mktemp("cache")
    done = prepare_with_cli(cache_dir)
    assert done.returncode == 0, done.stderr
    return cache_dir / "models" / MODEL, done
