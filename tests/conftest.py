"""Shared fixtures: the repository root and an environment free of user overrides."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from firstlight.config import ENV_PREFIX

REPO_ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


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
