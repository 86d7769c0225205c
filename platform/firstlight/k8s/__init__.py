"""Kubernetes-facing parts of Firstlight.

* :mod:`firstlight.k8s.values_schema` — the Helm chart's ``values.schema.json``,
  generated from ``PlatformConfig`` (``make helm-schema``).
* :mod:`firstlight.k8s.helm_values` — a config file as chart values
  (``firstlight config to-helm-values``).
* :mod:`firstlight.k8s.status` and :mod:`firstlight.k8s.cli` — ``firstlight status``:
  every cluster's RayService, Serve applications, replicas and endpoint (read-only,
  through the ``kubernetes`` client, imported only when the command runs).
* :mod:`firstlight.k8s.endpoint_check` — ``firstlight check``, the chart's ``helm test``.

Re-exported here: the pure pieces (no ``kubernetes`` import; ``values_schema`` runs as
``python -m``, so it is imported from its module).
"""

from firstlight.k8s._model import (
    AppStatus,
    Condition,
    ContextStatus,
    DeploymentStatus,
    RegionStatus,
)
from firstlight.k8s.endpoint_check import CheckStep, check_endpoint
from firstlight.k8s.helm_values import HelmValues, to_helm_values

__all__ = [
    "AppStatus",
    "CheckStep",
    "Condition",
    "ContextStatus",
    "DeploymentStatus",
    "HelmValues",
    "RegionStatus",
    "check_endpoint",
    "to_helm_values",
]
