"""Kubernetes and Ray objects shaped like the real APIs, for the ``firstlight status`` tests.

What the stand-in API servers (:mod:`tests.k8s.fake_apiserver`) serve: RayServices as
KubeRay >= 1.3 writes their status (``ray.io/v1``, fields from the CRD in
``../shared/k8s-crds/ray.io_rayservices.yaml``), an Ingress and an HTTPRoute as the chart
labels them, and the Ray dashboard's ``GET /api/serve/applications/`` body
(``ServeInstanceDetails``; a test validates it with Ray's own model).
"""

from __future__ import annotations

from typing import Any

import yaml

NS = "firstlight"

RAYSERVICE = """
apiVersion: ray.io/v1
kind: RayService
metadata:
  name: firstlight-{region}
  namespace: firstlight
  labels: {{app.kubernetes.io/name: firstlight, app.kubernetes.io/instance: firstlight,
           firstlight/region: {region}}}
spec:
  serveConfigV2: "applications: []"
  rayClusterConfig:
    headGroupSpec:
      rayStartParams: {{}}
      template: {{spec: {{containers: [{{name: ray-head, image: "rayproject/ray:2.60.0"}}]}}}}
status:
  serviceStatus: Running
  numServeEndpoints: 2
  conditions:
  - {{type: Ready, status: "True", reason: NonZeroServeEndpoints, message: "",
     lastTransitionTime: "2026-11-30T12:00:00Z"}}
  activeServiceStatus:
    rayClusterName: firstlight-{region}-raycluster-x7k2p
    rayClusterStatus: {{state: ready{head}}}
    applicationStatuses:
      firstlight:
        status: {app_status}
        message: "{message}"
        serveDeploymentStatuses:
          gateway: {{status: HEALTHY}}
          model-x: {{status: {model_status}}}
"""
INGRESS = """
metadata: {name: firstlight, namespace: firstlight, labels: {app.kubernetes.io/instance: firstlight}}
spec:
  ingressClassName: nginx
  tls: [{hosts: [us-east.llm.example.com], secretName: firstlight-tls}]
  rules:
  - host: us-east.llm.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: firstlight-us-east-serve-svc, port: {number: 8000}}}}]}
"""
HTTPROUTE = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: firstlight, namespace: firstlight, labels: {app.kubernetes.io/instance: firstlight}}
spec:
  parentRefs: [{name: public}]
  hostnames: [eu-west.llm.example.com]
  rules: [{backendRefs: [{name: firstlight-eu-west-serve-svc, port: 8000}]}]
"""
UNRELATED = {
    "metadata": {"name": "x", "namespace": NS, "labels": {"app.kubernetes.io/instance": "x"}}
}
EU_HEAD = "firstlight-eu-west-raycluster-x7k2p-head-svc"


def rayservice(
    region: str, app_status: str, model_status: str, message: str = "", head: str = ""
) -> Any:
    head_field = f", head: {{serviceName: {head}, podName: head-0}}" if head else ""
    text = RAYSERVICE.format(
        region=region,
        app_status=app_status,
        model_status=model_status,
        message=message,
        head=head_field,
    )
    return yaml.safe_load(text)


def serve_details(deployments: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """Ray's ``GET /api/serve/applications/`` body; deployment -> (running, target)."""

    def replica(dep: str, i: int, state: str) -> dict[str, Any]:
        return {"node_id": "n1", "node_ip": "10.0.0.5", "actor_id": f"{dep}{i}", "actor_name": f"SERVE_REPLICA::firstlight#{dep}#{i}",
                "worker_id": f"w{i}", "log_file_path": f"/serve/{dep}_{i}.log", "replica_id": f"{dep}-{i}",
                "state": state, "pid": 100 + i, "start_time_s": 1764500000.0}  # fmt: skip

    def deployment(dep: str, running: int, target: int) -> dict[str, Any]:
        replicas = [
            replica(dep, i, "RUNNING" if i < running else "STARTING") for i in range(target)
        ]
        return {"name": dep, "status": "HEALTHY" if running == target else "UPSCALING", "status_trigger": "CONFIG_UPDATE_COMPLETED",
                "message": "", "deployment_config": {"name": dep, "num_replicas": target}, "target_num_replicas": target,
                "required_resources": {"CPU": 1}, "replicas": replicas}  # fmt: skip

    application = {"name": "firstlight", "route_prefix": "/", "docs_path": None, "status": "RUNNING", "message": "",
                   "last_deployed_time_s": 1764500000.0, "source": "declarative", "external_scaler_enabled": False,
                   "deployments": {d: deployment(d, *counts) for d, counts in deployments.items()}}  # fmt: skip
    return {"controller_info": {"node_id": "n1", "actor_name": "SERVE_CONTROLLER_ACTOR"}, "proxy_location": "EveryNode",
            "proxies": {"n1": {"node_id": "n1", "node_ip": "10.0.0.5", "status": "HEALTHY"}},
            "applications": {"firstlight": application}, "target_capacity": None}  # fmt: skip
