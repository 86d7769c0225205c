"""The source layout guards: `platform/` must never shadow the standard library."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import firstlight
from tests.conftest import REPO_ROOT, VENV_BIN


def test_platform_folder_has_no_init_file() -> None:
    assert not (REPO_ROOT / "platform" / "__init__.py").exists()


def test_platform_source_root_holds_the_serving_and_benchmark_packages() -> None:
    entries = {p.name for p in (REPO_ROOT / "platform").iterdir() if p.name != "__pycache__"}
    assert entries == {"firstlight", "firstlight_bench"}


def test_import_platform_from_the_repo_root_is_the_standard_library() -> None:
    # `python -c` puts the current directory first on sys.path: the shadowing case.
    code = "import platform, uuid; print(platform.__file__); print(platform.python_version())"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    module_file, python_version = done.stdout.split()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(module_file).resolve().parent == stdlib
    assert python_version == ".".join(map(str, sys.version_info[:3]))


def test_package_is_typed_and_installed_with_its_console_script() -> None:
    package_dir = Path(firstlight.__file__).resolve().parent
    assert package_dir == REPO_ROOT / "platform" / "firstlight"
    assert (package_dir / "py.typed").is_file()
    assert (VENV_BIN / "firstlight").is_file()


def test_top_level_layout_matches_the_architecture() -> None:
    for name in ("pyproject.toml", "README.md", "platform", "helm", "terraform", "tests", "docs"):
        assert (REPO_ROOT / name).exists(), name
