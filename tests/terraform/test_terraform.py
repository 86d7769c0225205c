"""The Terraform modules and example load with Terraform's own loader, follow the
community modules' conventions, are formatted canonically and pass checkov; and the
values the region module gives the chart pass the chart's schema."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import hcl2
import pytest

from tests.terraform.terraform import (
    EXAMPLES,
    MODULES,
    REPO,
    ROOTS,
    TERRAFORM,
    literal,
    named,
    parse_dir,
    scratch_copy,
    terraform,
)

CHECKOV = REPO / ".venv-tools" / "bin" / "checkov"
REQUIRED_FILES = ("main.tf", "variables.tf", "outputs.tf", "versions.tf", "README.md")


def _ids(paths: list[Path]) -> list[str]:
    return [p.relative_to(TERRAFORM).as_posix() for p in paths]


@pytest.mark.parametrize("root", ROOTS, ids=_ids(ROOTS))
def test_terraform_loads_every_module_without_configuration_errors(
    root: Path, tmp_path: Path
) -> None:
    copy = scratch_copy(tmp_path) / root.relative_to(TERRAFORM)
    result = terraform(copy, "init", backend=False, input=False)
    assert result.config_errors == [], result.stderr
    if not result.errors:
        assert result.retcode == 0, result.stderr


def test_the_loader_reports_configuration_errors(tmp_path: Path) -> None:
    """The offline-error filter must not hide real problems, in a module or in a local
    module it calls."""
    copy = scratch_copy(tmp_path)
    variables = copy / "modules/firstlight-values/variables.tf"
    variables.write_text(variables.read_text().replace("type        = number", "type = numbr", 1))
    main = copy / "modules/region-aws/main.tf"
    main.write_text(main.read_text() + '\nresourse "aws_s3_bucket" "typo" {}\n')
    result = terraform(copy / "modules/region-aws", "init", backend=False, input=False)
    problems = "\n".join(result.config_errors)
    assert "Invalid type specification" in problems
    assert 'Blocks of type "resourse" are not expected here' in problems
    # (A module call's unknown argument is a validate-time error, which needs the
    # providers; test_local_module_calls_match_the_called_module checks those.)


def test_formatting_is_canonical(tmp_path: Path) -> None:
    """``terraform fmt -check -recursive`` (no ``-diff``: it needs a ``diff`` binary)."""
    result = terraform(TERRAFORM, "fmt", check=True, recursive=True)
    assert (result.retcode, result.stdout) == (0, ""), "run terraform fmt on:\n" + result.stdout
    copy = scratch_copy(tmp_path)
    outputs = copy / "modules/region-aws/outputs.tf"
    outputs.write_text(outputs.read_text().replace("  value       =", "  value =", 1))
    unformatted = terraform(copy, "fmt", check=True, recursive=True)
    assert (unformatted.retcode, unformatted.stdout) == (3, "modules/region-aws/outputs.tf\n")


@pytest.mark.parametrize("root", MODULES + EXAMPLES, ids=_ids(MODULES + EXAMPLES))
def test_module_layout_and_readme(root: Path) -> None:
    for name in REQUIRED_FILES:
        assert (root / name).is_file(), f"{root.name} lacks {name}"
    blocks = parse_dir(root)
    readme = (root / "README.md").read_text(encoding="utf-8")
    for name in (*named(blocks.get("variable", [])), *named(blocks.get("output", []))):
        assert f"`{name}`" in readme, f"{root.name}/README.md does not document {name}"


def _all_dirs() -> list[Path]:
    return sorted({p.parent for p in TERRAFORM.rglob("*.tf")})


@pytest.mark.parametrize("folder", _all_dirs(), ids=_ids(_all_dirs()))
def test_variables_are_typed_and_described_and_outputs_described(folder: Path) -> None:
    blocks = parse_dir(folder)
    for name, variable in named(blocks.get("variable", [])).items():
        assert "type" in variable, f"{folder.name}: variable {name} has no type"
        assert len(literal(variable.get("description", ""))) >= 10, f"variable {name}"
    for name, output in named(blocks.get("output", [])).items():
        assert len(literal(output.get("description", ""))) >= 10, f"output {name}"


@pytest.mark.parametrize("folder", _all_dirs(), ids=_ids(_all_dirs()))
def test_versions_are_pinned(folder: Path) -> None:
    blocks = parse_dir(folder)
    (settings,) = blocks["terraform"]
    assert re.match(r">= ?1\.\d", literal(settings["required_version"]))
    for providers in settings.get("required_providers", []):
        for name, requirement in providers.items():
            if name == "__is_block__":
                continue
            version = literal(requirement["version"])
            assert "<" in version or "~>" in version, f"{name} {version!r} has no upper bound"
    for call in named(blocks.get("module", [])).values():
        source = literal(call["source"])
        if not source.startswith("."):
            assert re.fullmatch(r"~> \d+\.\d+", literal(call.get("version", ""))), source


@pytest.mark.parametrize("folder", _all_dirs(), ids=_ids(_all_dirs()))
def test_local_module_calls_match_the_called_module(folder: Path) -> None:
    for name, call in named(parse_dir(folder).get("module", [])).items():
        source = literal(call["source"])
        if not source.startswith("."):
            continue
        target = (folder / source).resolve()
        assert target.is_dir(), f"module {name}: {source} does not exist"
        variables = named(parse_dir(target).get("variable", []))
        arguments = set(call) - {
            "source",
            "version",
            "providers",
            "count",
            "for_each",
            "depends_on",
        }
        assert arguments <= set(variables), f"module {name}: unknown {arguments - set(variables)}"
        required = {v for v, spec in variables.items() if "default" not in spec}
        assert required <= arguments, f"module {name}: missing {required - arguments}"


SECRET_PATTERNS = {
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "AWS account id in an ARN": re.compile(r"arn:aws[-a-z]*:[a-z0-9-]*:[a-z0-9-]*:\d{12}:"),
    "account id": re.compile(r"(?i)account[_-]?id\s*=\s*\"?\d{12}"),
    # A name ending in password/token/api_key/secret given a literal string.
    "literal password or token": re.compile(
        r"(?i)\b\w*(password|token|api_key|secret)\s*=\s*\"[^\"$]{6,}\""
    ),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
}


def test_no_hard_coded_secrets_or_account_ids() -> None:
    for path in sorted(TERRAFORM.rglob("*")):
        if path.is_file() and path.suffix in {".tf", ".md", ".tfvars", ".json", ".hcl"}:
            text = path.read_text(encoding="utf-8")
            for what, pattern in SECRET_PATTERNS.items():
                assert not pattern.search(text), f"{path.relative_to(REPO)}: {what}"


def test_secrets_never_leave_in_outputs() -> None:
    """The Redis token and the API keys go only to Kubernetes Secrets; an output that
    names them must be sensitive."""
    for folder in _all_dirs():
        for name, output in named(parse_dir(folder).get("output", [])).items():
            value = str(output.get("value", ""))
            if re.search(r"random_password|api_keys|auth_token", value):
                assert output.get("sensitive") is True, f"{folder.name} output {name}"
    outputs = named(parse_dir(TERRAFORM / "modules/region-aws").get("output", []))
    assert not any("redis_auth" in str(o.get("value")) for o in outputs.values())


def _resources(module: str, kind: str) -> dict[str, dict[str, Any]]:
    """A module's resources of one type, by name (hcl2's shape flattened)."""
    found: dict[str, Any] = {}
    for block in parse_dir(TERRAFORM / "modules" / module)["resource"]:
        for block_kind, body in block.items():
            if literal(block_kind) == kind:
                found.update(named([body]))
    return found


def _ingress_service_annotations() -> dict[str, str]:
    """The annotations of the ingress controller's Service (its load balancer)."""
    values = str(_resources("region-aws", "helm_release")["ingress"]["values"])
    pairs = re.findall(r'"(service\.beta\.kubernetes\.io/[\w.-]+)"\s*=\s*"([^"]*)"', values)
    return dict(pairs)


def test_the_cluster_enforces_network_policies() -> None:
    """The hole: the VPC CNI add-on was installed without network-policy enforcement, so
    the chart's NetworkPolicies were not enforced on the clusters the Terraform builds."""
    eks = named(parse_dir(TERRAFORM / "modules/region-aws")["module"])["eks"]
    vpc_cni = eks["addons"]["vpc-cni"]
    assert "enableNetworkPolicy" in str(vpc_cni["configuration_values"])
    assert '"true"' in str(vpc_cni["configuration_values"]).replace("\\", "")


def test_the_load_balancer_accepts_tls_1_2_and_up_only() -> None:
    """The hole: the NLB's TLS listener took the provider's default policy (TLS 1.0 and
    1.1 allowed)."""
    annotations = _ingress_service_annotations()
    policy = annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy"]
    assert policy == "ELBSecurityPolicy-TLS13-1-2-2021-06"


def test_the_example_keeps_its_state_encrypted_with_a_kms_key_and_locked() -> None:
    """The hole: the state holds the ElastiCache auth tokens, and the example had no
    backend: `terraform apply` left them in a plain local terraform.tfstate."""
    example = TERRAFORM / "examples/three-regions"
    (settings,) = parse_dir(example)["terraform"]
    (backend,) = settings["backend"]
    s3 = backend['"s3"']
    assert s3["encrypt"] is True
    assert s3["use_lockfile"] is True
    # The rest is partial configuration: the README's init uses the example file.
    filled = hcl2.loads((example / "backend.hcl.example").read_text(encoding="utf-8"))
    assert {"bucket", "key", "region", "kms_key_id"} <= set(filled)
    assert literal(filled["kms_key_id"]).startswith("arn:aws:kms:")
    readme = (example / "README.md").read_text(encoding="utf-8")
    assert "terraform init -backend-config=backend.hcl" in readme


def test_checkov_passes_with_justified_skips() -> None:
    if not CHECKOV.is_file():
        pytest.fail(f"{CHECKOV} is missing: run `make tools` (make test does)")
    run = subprocess.run(
        [
            str(CHECKOV),
            "-d",
            str(TERRAFORM),
            "--framework",
            "terraform",
            "--compact",
            "--output",
            "json",
            "--skip-download",
            "--download-external-modules",
            "false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = json.loads(run.stdout)
    reports = report if isinstance(report, list) else [report]
    for part in reports:
        summary = part["summary"]
        failed = part.get("results", {}).get("failed_checks", [])
        assert summary["failed"] == 0, [
            (f["check_id"], f["resource"], f["file_path"]) for f in failed
        ]
        assert summary["passed"] > 20
        for skipped in part.get("results", {}).get("skipped_checks", []):
            reason = skipped["check_result"].get("suppress_comment", "")
            assert len(reason) > 30, f"{skipped['check_id']} on {skipped['resource']}: {reason!r}"
    assert run.returncode == 0, run.stderr[-2000:]
