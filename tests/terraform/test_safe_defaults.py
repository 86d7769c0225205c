"""Terraform is safe by default: the EKS API is not open to the internet unless the
caller says so, API keys never enter Terraform's state (the ElastiCache token, which
must, is documented as the exception), and the example's provider lock file is kept."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pathspec
import pytest

from tests.terraform.terraform import (
    EXAMPLES,
    REPO,
    TERRAFORM,
    literal,
    named,
    parse_dir,
    terraform,
)

REGION = TERRAFORM / "modules/region-aws"
EXAMPLE = TERRAFORM / "examples/three-regions"
OPEN = ("0.0.0.0/0", "::/0")


def _folders() -> list[Path]:
    return sorted({p.parent for p in TERRAFORM.rglob("*.tf")})


def _variables(folder: Path) -> dict[str, dict[str, Any]]:
    return named(parse_dir(folder).get("variable", []))


# --- the Kubernetes API endpoint ---------------------------------------------------------


def test_no_default_opens_anything_to_the_internet() -> None:
    for folder in _folders():
        for name, variable in _variables(folder).items():
            default = json.dumps(variable.get("default"))
            for cidr in OPEN:
                assert cidr not in default, f"{folder.name}: {name} defaults to {cidr}"


def test_the_api_endpoint_cidrs_are_required_and_empty_means_private() -> None:
    variable = _variables(REGION)["endpoint_public_access_cidrs"]
    assert "default" not in variable  # every caller decides
    (eks,) = [call for name, call in named(parse_dir(REGION)["module"]).items() if name == "eks"]
    assert literal(eks["endpoint_public_access_cidrs"]) == "${var.endpoint_public_access_cidrs}"
    assert re.fullmatch(
        r"\$\{length\(var\.endpoint_public_access_cidrs\) > 0\}",
        literal(eks["endpoint_public_access"]),
    ), eks["endpoint_public_access"]
    for example in EXAMPLES:
        assert "default" not in _variables(example).get("endpoint_public_access_cidrs", {})


def _variables_root(tmp_path: Path, tfvars: dict[str, Any]) -> Path:
    """The region module's variables alone, to let Terraform judge inputs."""
    root = tmp_path / "variables"
    root.mkdir()
    for name in ("variables.tf", "firstlight_variables.tf"):
        (root / name).write_text((REGION / name).read_text(encoding="utf-8"))
    (root / "out.tf").write_text(
        'output "public" {\n  value = length(var.endpoint_public_access_cidrs) > 0\n}\n'
    )
    (root / "terraform.tfvars.json").write_text(json.dumps(tfvars))
    return root


REQUIRED = {
    "region_name": "us-east",
    "domain": "llm.example.com",
    "zone_id": "Z0000000000000EXAMPLE",
    "vpc_id": "vpc-0123456789abcdef0",
    "private_subnet_ids": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
    "image": {"repository": "registry.example.com/firstlight/firstlight", "tag": "0.1.0"},
    "helm_repositories": {
        "kuberay": "https://charts.example.com/kuberay",
        "traefik": "https://charts.example.com/traefik",
        "nvidia_device_plugin": "https://charts.example.com/nvidia",
        "cluster_autoscaler": "https://charts.example.com/autoscaler",
        "aws_load_balancer_controller": "https://charts.example.com/eks",
    },
}


@pytest.mark.parametrize(
    ("cidrs", "expected"),
    [
        (None, "endpoint_public_access_cidrs"),  # omitted: Terraform refuses
        (["not-a-cidr"], "must be CIDR blocks"),
        ([], False),  # private endpoint only
        (["203.0.113.0/24"], True),
    ],
    ids=["omitted", "invalid", "private", "narrowed"],
)
def test_terraform_judges_the_endpoint_input(
    tmp_path: Path, cidrs: list[str] | None, expected: str | bool
) -> None:
    tfvars = dict(REQUIRED)
    if cidrs is not None:
        tfvars["endpoint_public_access_cidrs"] = cidrs
    root = _variables_root(tmp_path, tfvars)
    init = terraform(root, "init", backend=False, input=False)
    assert init.retcode == 0, init.stderr
    apply = terraform(root, "apply", auto_approve=True, input=False)
    if isinstance(expected, str):
        assert apply.retcode != 0
        assert expected in apply.stderr, apply.stderr
    else:
        assert apply.retcode == 0, apply.stderr
        out = json.loads(terraform(root, "output", json=True).stdout)
        assert out["public"]["value"] is expected


# --- secrets and state -------------------------------------------------------------------


def test_api_keys_are_never_terraform_values() -> None:
    """Anything Terraform is given lands in its state: API keys must not be variables,
    generated passwords or Secret data, only the name of a Secret made outside it."""
    for folder in _folders():
        blocks = parse_dir(folder)
        for name, variable in _variables(folder).items():
            assert not re.search(r"api_keys?$", name), f"{folder.name}: variable {name}"
            assert variable.get("sensitive") is not True, f"{folder.name}: variable {name}"
        for resources in blocks.get("resource", []):
            for kind, instances in resources.items():
                for label, body in instances.items():
                    where = f"{folder.name}: {literal(kind)}.{literal(label)}"
                    assert "api_key" not in literal(label), where
                    if literal(kind) == "random_password":
                        assert literal(label) == "redis_auth", where  # the documented one
                    if literal(kind) == "kubernetes_secret_v1":
                        assert "api_key" not in json.dumps(body), where
    variables = _variables(REGION)
    assert literal(variables["api_keys_secret_name"]["default"]) == "firstlight-api-keys"


def test_the_redis_token_exception_is_documented() -> None:
    readme = (REGION / "README.md").read_text(encoding="utf-8")
    assert "## Secrets and Terraform state" in readme
    assert "**The ElastiCache auth token: in the state.**" in readme
    assert "**API keys: not in the state.**" in readme
    deploy = (REPO / "docs/deploy.md").read_text(encoding="utf-8")
    assert "api_keys_secret_name" in deploy
    assert "ElastiCache auth token is in Terraform's state" in deploy


# --- the example's lock file --------------------------------------------------------------


def test_gitignore_keeps_the_examples_lock_file_only() -> None:
    spec = pathspec.GitIgnoreSpec.from_lines(
        (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
    )
    assert not spec.match_file("terraform/examples/three-regions/.terraform.lock.hcl")
    assert spec.match_file("terraform/modules/region-aws/.terraform.lock.hcl")
    assert spec.match_file("scratch/.terraform.lock.hcl")
    assert spec.match_file("terraform/examples/three-regions/.terraform/providers/x")
    assert spec.match_file("terraform/examples/three-regions/terraform.tfstate")
    readme = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    assert "terraform providers lock" in readme
