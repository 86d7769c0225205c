"""A mutation-testing run over the pure core, sampled, with cosmic-ray (from PyPI).

``make mutation`` (which installs cosmic-ray into ``.venv-mutation``, its pins being its
own) runs ``python -m tests.mutation --cosmic-ray .venv-mutation/bin --out
docs/benchmarks/mutation``: for each group below, cosmic-ray lists every mutant of the
group's modules (an operator swapped, a comparison turned, a constant moved, a ``break``
made ``continue``...); those in a function's signature (its annotations, never evaluated
here, and its ``*`` and ``/`` markers) or in an annotation nothing evaluates (a local
variable's, a dataclass field's; a pydantic field's is evaluated and stays) are set aside
as changing nothing that runs; of
the rest a seeded sample of ``--sample`` is kept (the others marked skipped: the full
set is thousands of mutants, hours per group on two cores),
and each kept mutant is applied to a scratch copy of the checkout (``HEAD``; refused with
uncommitted changes) and the group's tests run against it. A mutant the tests fail on
is *killed*; one they pass is a *survivor*, a change to the code no test notices.

The stored ``results.json`` has each group's counts and every survivor (module, line,
operator, diff); ``docs/development.md`` shows the table, generated
(:func:`render_mutation`) and held to the file by ``tests/test_mutation_doc.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).parents[1]
BEGIN = (
    "<!-- mutation:begin (generated from docs/benchmarks/mutation/results.json; do not edit) -->"
)
END = "<!-- mutation:end -->"
STORED = REPO / "docs" / "benchmarks" / "mutation" / "results.json"


@dataclass(frozen=True)
class Group:
    """Modules mutated together and the tests that must notice."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]


GROUPS = (
    Group("routing", ("platform/firstlight/routing",), ("tests/routing",)),
    Group("region", ("platform/firstlight/region",), ("tests/region",)),
    Group(
        "hints",
        (
            "platform/firstlight/hints/mirror.py",
            "platform/firstlight/hints/_lookups.py",
            "platform/firstlight/hints/_codec.py",
            "platform/firstlight/hints/_events.py",
            "platform/firstlight/hints/subscriber.py",
            "platform/firstlight/hints/store.py",
        ),
        ("tests/hints",),
    ),
    Group("prefix", ("platform/firstlight/prefix.py",), ("tests/test_prefix.py",)),
    Group(
        "request preparation",
        ("platform/firstlight/api/prepare.py",),
        ("tests/api/test_prepare.py", "tests/api/test_prompts.py"),
    ),
)

_SAMPLER = r"""
import ast, hashlib, os, sys
from pathlib import Path
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkResult, WorkerOutcome

db, keep, seed, root = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
_signatures = {}

def _span(node):
    return ((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset))

def signature_spans(path):
    # Per function: (start, end) of its signature, and the spans of its defaults inside;
    # then the annotations never evaluated: of local variables, and of the fields of
    # dataclasses (a pydantic model's are evaluated, and stay).
    if path not in _signatures:
        spans = []
        tree = ast.parse(Path(path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = (node.lineno, node.col_offset)
                end = (node.body[0].lineno, node.body[0].col_offset)
                defaults = [_span(d) for d in (*node.args.defaults, *node.args.kw_defaults)
                            if d is not None]
                spans.append((start, end, defaults))
                for inner in ast.walk(node):
                    if isinstance(inner, ast.AnnAssign):
                        spans.append((*_span(inner.annotation), []))
            elif isinstance(node, ast.ClassDef) and any(
                "dataclass" in ast.unparse(d) for d in node.decorator_list
            ):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign):
                        spans.append((*_span(item.annotation), []))
        _signatures[path] = spans
    return _signatures[path]

def in_signature(mutation):
    # A mutant in a def's annotations or its * and / markers, or in an annotation never
    # evaluated, changes nothing that runs: annotations are not evaluated here (PEP 563)
    # unless pydantic reads them, and every call site names its keyword arguments.
    # Defaults are code: they stay.
    pos = tuple(mutation.start_pos)
    for start, end, defaults in signature_spans(str(mutation.module_path)):
        if start <= pos < end and not any(d0 <= pos < d1 for d0, d1 in defaults):
            return True
    return False

def key(item):
    m = item.mutations[0]
    # The module's path inside the repository, not inside this run's temporary clone:
    # with the clone's path in the key every run drew a new sample, whatever the seed.
    module = os.path.relpath(str(m.module_path), root)
    text = f"{seed}|{module}|{m.operator_name}|{m.occurrence}|{m.start_pos}"
    return hashlib.sha256(text.encode()).hexdigest()

with use_db(db, WorkDB.Mode.open) as work_db:
    items = list(work_db.pending_work_items)
    signature = [i for i in items if in_signature(i.mutations[0])]
    if signature:
        work_db.set_multiple_results(
            [i.job_id for i in signature],
            WorkResult(output="in a signature", worker_outcome=WorkerOutcome.SKIPPED),
        )
    kept = set(i.job_id for i in signature)
    ranked = sorted((i for i in items if i.job_id not in kept), key=key)
    skipped = [item.job_id for item in ranked[keep:]]
    if skipped:
        work_db.set_multiple_results(
            skipped, WorkResult(output="not sampled", worker_outcome=WorkerOutcome.SKIPPED)
        )
    print(len(items), len(signature))
"""


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def _config(group: Group, scratch: Path, timeout_s: float) -> str:
    tests = " ".join(group.tests)
    command = (
        f"{REPO / '.venv' / 'bin' / 'python'} -m pytest -x -q -p no:cacheprovider "
        f'-p no:randomly -m "not ray and not model" --no-header -o addopts="" {tests}'
    )
    modules = ", ".join(json.dumps(str(scratch / m)) for m in group.modules)
    return (
        "[cosmic-ray]\n"
        f"module-path = [{modules}]\n"
        f"timeout = {timeout_s}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )


def run_group(
    group: Group, scratch: Path, cosmic_ray: Path, sample: int, seed: int, timeout_s: float
) -> dict[str, Any]:
    """Mutate ``group`` in ``scratch`` (a copy of the checkout): a sample of ``sample``
    mutants, each tested; returns the group's counts and survivors."""
    work = scratch / ".mutation"
    work.mkdir(exist_ok=True)
    config = work / f"{group.name.replace(' ', '-')}.toml"
    config.write_text(_config(group, scratch, timeout_s))
    session = config.with_suffix(".sqlite")
    env = {**os.environ, "PYTHONPATH": str(scratch / "platform")}

    def cr(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(cosmic_ray / "cosmic-ray"), *args],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )

    cr("init", str(config), str(session))
    listed = subprocess.run(
        [
            str(cosmic_ray / "python"),
            "-c",
            _SAMPLER,
            str(session),
            str(sample),
            str(seed),
            str(scratch),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    mutants, in_signatures = (int(n) for n in listed.stdout.split())
    print(
        f"{group.name}: {mutants} mutants, {in_signatures} in signatures, testing {sample}",
        file=sys.stderr,
    )
    cr("exec", str(config), str(session))
    dumped = cr("dump", str(session)).stdout
    counts = {"killed": 0, "survived": 0, "incompetent": 0, "timeout": 0}
    survivors = []
    for line in dumped.splitlines():
        item, result = json.loads(line)
        if result is None or result["worker_outcome"] == "skipped":
            continue
        mutation = item["mutations"][0]
        outcome = result["test_outcome"]
        if result["worker_outcome"] == "abnormal" or outcome is None:
            counts["timeout"] += 1  # the tests did not finish: counted as killed
            continue
        counts[outcome] += 1
        if outcome == "survived":
            survivors.append(
                {
                    "module": str(Path(mutation["module_path"]).relative_to(scratch)),
                    "line": mutation["start_pos"][0],
                    "operator": mutation["operator_name"].removeprefix("core/"),
                    "diff": "\n".join(
                        line
                        for line in (result.get("diff") or "").splitlines()
                        if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))
                    ),
                }
            )
    return {
        "group": group.name,
        "modules": list(group.modules),
        "tests": list(group.tests),
        "mutants": mutants,
        "in_signatures": in_signatures,
        "sampled": sample,
        **counts,
        "survivors": sorted(survivors, key=lambda s: (s["module"], s["line"])),
    }


def score(group: dict[str, Any]) -> float | None:
    """Killed (timeouts and incompetent mutants included: the tests did not pass them)
    over the mutants tested."""
    tested = group["killed"] + group["survived"] + group["incompetent"] + group["timeout"]
    return None if tested == 0 else (tested - group["survived"]) / tested


def render_mutation(data: dict[str, Any]) -> str:
    """The development page's generated section from a stored ``results.json``."""
    meta = data["meta"]
    lines = [
        BEGIN,
        "",
        f"`{meta['command']}` at commit `{meta['git_commit'][:12]}`, cosmic-ray "
        f"{meta['cosmic_ray']}, seed {meta['seed']}: a sample of each group's mutants, "
        "each tested by the group's own tests.",
        "",
        "| group | mutants | in signatures | tested | killed | survived | score |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for group in data["groups"]:
        value = score(group)
        tested = group["killed"] + group["survived"] + group["incompetent"] + group["timeout"]
        shown = "—" if value is None else f"{100 * value:.1f} %"
        lines.append(
            f"| {group['group']} | {group['mutants']:,} | {group['in_signatures']:,} | {tested} | "
            f"{tested - group['survived']} | {group['survived']} | {shown} |"
        )
    total = sum(g["survived"] for g in data["groups"])
    tested_all = sum(
        g["killed"] + g["survived"] + g["incompetent"] + g["timeout"] for g in data["groups"]
    )
    if tested_all:
        lines.append(
            f"| **all** | {sum(g['mutants'] for g in data['groups']):,} | "
            f"{sum(g['in_signatures'] for g in data['groups']):,} | {tested_all} | "
            f"{tested_all - total} | {total} | **{100 * (tested_all - total) / tested_all:.1f} %** |"
        )
    lines += ["", END]
    return "\n".join(lines)


def shown_mutation(page: str) -> str:
    start, end = page.index(BEGIN), page.index(END) + len(END)
    return page[start:end]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cosmic-ray", type=Path, required=True, help="cosmic-ray's bin/.")
    parser.add_argument("--out", type=Path, required=True, help="Folder of results.json.")
    parser.add_argument("--sample", type=int, default=60, help="Mutants tested per group.")
    parser.add_argument("--seed", type=int, default=0, help="Which mutants are sampled.")
    parser.add_argument("--timeout", type=float, default=120.0, help="Per mutant, seconds.")
    parser.add_argument("--only", default="", help="Comma-separated groups (default: all).")
    args = parser.parse_args()
    args.cosmic_ray = args.cosmic_ray.resolve()
    if _git("status", "--porcelain"):
        raise SystemExit("uncommitted changes: commit first, the score names a commit")
    commit = _git("rev-parse", "HEAD")  # what the clone below holds
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    groups = [g for g in GROUPS if not wanted or g.name in wanted]
    version = subprocess.run(
        [str(args.cosmic_ray / "cosmic-ray"), "--version"], capture_output=True, text=True
    ).stdout.split()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "checkout"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(scratch)], check=True)
        results = [
            run_group(g, scratch, args.cosmic_ray, args.sample, args.seed, args.timeout)
            for g in groups
        ]
        shutil.rmtree(scratch / ".mutation", ignore_errors=True)
    command = "make mutation"
    if args.only or args.sample != 60 or args.seed != 0:
        command += f" MUTATION_ARGS='--sample {args.sample} --seed {args.seed}"
        command += f" --only {args.only}'" if args.only else "'"
    data = {
        "meta": {
            "git_commit": commit,
            "command": command,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cosmic_ray": version,
            "seed": args.seed,
        },
        "groups": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    print(render_mutation(data))


if __name__ == "__main__":
    main()
