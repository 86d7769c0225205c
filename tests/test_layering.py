"""The package's layering: no import cycles between its parts, ``api`` never imports
``serve``, and the pure parts import no Ray, FastAPI, vLLM or torch — read from the source
(every import statement, lazy ones inside functions included; ``TYPE_CHECKING`` blocks
excluded) and checked at run time in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "platform" / "firstlight"
PURE = (
    "config",
    "errors",
    "prefix",
    "quantiles",
    "routing",
    "hints",
    "region",
    "regions",
    "advisor",
)
"""Parts that hold logic only: the gateway, the Ray adapter and the simulator all run them."""
HEAVY = ("ray", "vllm", "fastapi", "starlette", "torch", "transformers")


def _part(module: str) -> str:
    """``firstlight.api.gateway`` → ``api``; top-level modules are parts of their own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(path: Path) -> Iterable[str]:
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _module_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(relative.parts).removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    """Part → the parts it imports (edges between different parts only)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        source = _part(_module_of(path))
        graph.setdefault(source, set())
        for module in _imports(path):
            if module.startswith("firstlight.") and _part(module) != source:
                graph[source].add(_part(module))
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one part (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_checker_finds_a_back_edge() -> None:
    layered = {"api": {"region"}, "serve": {"api", "region"}, "region": {"routing"}}
    assert cycles(layered) == []
    assert cycles({**layered, "region": {"routing", "serve"}}) == [["api", "region", "serve"]]


def test_no_import_cycles_between_the_parts_of_the_package() -> None:
    assert cycles(import_graph()) == []


def test_the_serving_package_never_imports_the_benchmark() -> None:
    found = sorted(
        f"{path.relative_to(PACKAGE)}: {module}"
        for path in PACKAGE.rglob("*.py")
        for module in _imports(path)
        if module.split(".")[0] == "firstlight_bench"
    )
    assert found == []


def test_the_http_layer_does_not_import_the_ray_adapter() -> None:
    graph = import_graph()
    assert "serve" not in graph["api"]
    assert "serve" not in graph["dashboard"]


@pytest.mark.parametrize("part", PURE)
def test_pure_parts_import_no_framework_in_their_source(part: str) -> None:
    folder = PACKAGE / part
    files = list(folder.rglob("*.py")) if folder.is_dir() else [PACKAGE / f"{part}.py"]
    assert files
    heavy = sorted(
        f"{path.relative_to(PACKAGE)}: {module}"
        for path in files
        for module in _imports(path)
        if module.split(".")[0] in HEAVY
    )
    assert heavy == []


def test_pure_parts_load_no_framework_at_run_time() -> None:
    code = (
        "import json, sys\n"
        + "".join(f"import firstlight.{part}\n" for part in PURE)
        + f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(done.stdout) == []
