"""Rendering the Helm chart offline with Helm's own Go SDK (``helm-python-sdk``), and the
schemas its manifests are validated against.

Shared by the chart tests. Core kinds are validated with ``kubernetes-validate`` against
the Kubernetes versions in :data:`KUBE_VERSIONS`; KubeRay's and the Prometheus
Operator's kinds against their CRD schemas in ``../shared/k8s-crds/`` beside the
repository (skipped, with the reason, where that folder is absent — as on a user's
machine).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml
from helm_python import _native

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "firstlight"
EXAMPLES = sorted((REPO / "examples" / "helm").glob("*.values.yaml"))
CRD_DIR = REPO.parent / "shared" / "k8s-crds"
RELEASE = "firstlight"
NAMESPACE = "llm"

KUBE_VERSIONS = ("1.27", "1.37")
"""The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion) and the newest
schema kubernetes-validate ships."""

MONITORING_APIS = (
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
"""What a cluster running the Prometheus Operator advertises (``helm template
--api-versions``): the group version and each of its kinds the chart renders."""

CRD_FILES = {
    "RayService": "ray.io_rayservices.yaml",
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}


@dataclass(frozen=True)
class Manifest:
    """One rendered object and the template it came from."""

    template: str
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        kind: str = self.doc["kind"]
        return kind

    @property
    def name(self) -> str:
        name: str = self.doc["metadata"]["name"]
        return name


@dataclass(frozen=True)
class Rendered:
    """A rendered release: its manifests and NOTES.txt."""

    manifests: list[Manifest]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m.doc for m in self.manifests if m.kind == kind]

    def one(self, kind: str) -> dict[str, Any]:
        (doc,) = self.of_kind(kind)
        return doc


def load_values(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return data


def render(values: dict[str, Any] | None = None, *, api_versions: Sequence[str] = ()) -> Rendered:
    """Render the chart as ``helm template`` would; every output must be valid YAML.

    ``api_versions`` are what the cluster advertises besides the built-in kinds, as
    ``helm template --api-versions`` takes them (``.Capabilities.APIVersions``). The SDK's
    ``Chart.render`` has no parameter for them, so then the SDK's own render call is made
    with the option its library accepts (``api_versions``, as Helm's ``--api-versions``).
    """
    with helm.Chart.load(str(CHART_DIR)) as chart:
        if api_versions:
            options = {"name": RELEASE, "namespace": NAMESPACE, "api_versions": list(api_versions)}
            payload = _native.call_string(
                "helm_render", chart._raw(), json.dumps(values or {}), json.dumps(options)
            )
            files: dict[str, str] = json.loads(payload)
        else:
            files = chart.render(values=values or {}, name=RELEASE, namespace=NAMESPACE)
    manifests = []
    notes = ""
    for template, text in sorted(files.items()):
        if template.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                manifests.append(Manifest(template, doc))
    return Rendered(manifests, notes)


def serve_config(rendered: Rendered) -> dict[str, Any]:
    """The RayService's ``serveConfigV2``, parsed."""
    text = rendered.one("RayService")["spec"]["serveConfigV2"]
    assert isinstance(text, str), "serveConfigV2 must be a string (KubeRay's schema)"
    parsed: dict[str, Any] = yaml.safe_load(text)
    return parsed


def app_args(rendered: Rendered) -> dict[str, Any]:
    (application,) = serve_config(rendered)["applications"]
    args: dict[str, Any] = application["args"]
    return args


@functools.cache
def crd_validator(kind: str, *, strict: bool = False) -> jsonschema.Draft7Validator:
    """A validator for ``kind`` from its CRD's v1 schema; skips where the CRDs are absent.

    The CRDs never forbid unknown fields (the API server prunes them silently), so a
    misspelt field would pass; ``strict`` closes every object that lists its properties
    and does not preserve unknown fields, as ``kubectl apply --validate=strict`` would.
    """
    path = CRD_DIR / CRD_FILES[kind]
    if not path.is_file():
        pytest.skip(f"CRD schemas not found at {CRD_DIR} (shipped beside the repository in CI)")
    crd = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]
    if strict:
        schema = _closed(schema)
    return jsonschema.Draft7Validator(schema)


def _closed(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _closed(value) for key, value in schema.items()}
    if (
        isinstance(schema.get("properties"), dict)
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if "properties" in schema:  # property names are not schemas: keep them as they are
        out["properties"] = {k: _closed(v) for k, v in schema["properties"].items()}
    return out


def pod_specs(rendered: Rendered) -> list[tuple[str, dict[str, Any]]]:
    """Every pod spec of the release: Ray head and workers, Redis, the test pod."""
    specs = []
    ray = rendered.one("RayService")["spec"]["rayClusterConfig"]
    specs.append(("ray-head", ray["headGroupSpec"]["template"]["spec"]))
    for group in ray["workerGroupSpecs"]:
        specs.append((f"ray-worker/{group['groupName']}", group["template"]["spec"]))
    for sts in rendered.of_kind("StatefulSet"):
        specs.append((sts["metadata"]["name"], sts["spec"]["template"]["spec"]))
    for pod in rendered.of_kind("Pod"):
        specs.append((pod["metadata"]["name"], pod["spec"]))
    return specs
