"""What ``firstlight status`` reports, and how it is read out of the Kubernetes JSON.

The dataclasses are the result of :func:`firstlight.k8s.status.collect_status` (and the
``--output json`` document, through :meth:`ContextStatus.to_json`). The functions are
pure: :mod:`firstlight.k8s.status` passes them the decoded JSON bodies of the API server
(RayService, Ingress and HTTPRoute list items) and of the Ray dashboard. Nothing here
trusts a field to exist or to have its type: a missing field reads as unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import NamedTuple

FIRSTLIGHT_SELECTOR = "app.kubernetes.io/name=firstlight"
"""Label selector of the chart's RayServices."""

__all__ = [
    "AppStatus",
    "Condition",
    "ContextStatus",
    "DeploymentStatus",
    "RegionStatus",
    "ReplicaCount",
    "endpoint_from_httproutes",
    "endpoint_from_ingresses",
    "region_from_rayservice",
    "replicas_from_dashboard",
]

Json = object
"""A decoded JSON value, narrowed with :func:`as_map` and :func:`as_list` before use."""

REGION_LABEL = "firstlight/region"
INSTANCE_LABEL = "app.kubernetes.io/instance"


def as_map(value: Json) -> dict[str, Json]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def as_list(value: Json) -> list[Json]:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def _text(value: Json) -> str | None:
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class Condition:
    """One entry of a RayService's ``status.conditions`` (``Ready``, ``UpgradeInProgress``)."""

    type: str
    status: str
    """``True``, ``False`` or ``Unknown``."""
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class DeploymentStatus:
    """One Serve deployment of one application."""

    name: str
    status: str | None
    """KubeRay's copy of Serve's status (``HEALTHY``, ``UPDATING``, ``UNHEALTHY``...),
    else the dashboard's; ``None`` when neither reports one."""
    message: str = ""
    running_replicas: int | None = None
    """Replicas in state ``RUNNING`` per the Ray dashboard; ``None``: unknown."""
    target_replicas: int | None = None
    """Serve's ``target_num_replicas`` per the Ray dashboard; ``None``: unknown."""

    @property
    def replicas_text(self) -> str:
        """``running/target``, with ``?`` for an unknown count."""
        running = "?" if self.running_replicas is None else str(self.running_replicas)
        target = "?" if self.target_replicas is None else str(self.target_replicas)
        return f"{running}/{target}"


@dataclass(frozen=True, slots=True)
class AppStatus:
    """One Serve application as KubeRay reports it."""

    name: str
    status: str | None
    """``RUNNING``, ``DEPLOYING``, ``DEPLOY_FAILED``, ``UNHEALTHY``...; ``None``: unreported."""
    message: str = ""
    deployments: tuple[DeploymentStatus, ...] = ()


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """One Firstlight RayService: one region of one release."""

    region: str
    """The ``firstlight/region`` label, else the RayService's name."""
    namespace: str
    name: str
    """The RayService's name."""
    release: str | None
    """The ``app.kubernetes.io/instance`` label (the Helm release)."""
    service_status: str | None
    """KubeRay's ``status.serviceStatus``: ``Running`` when ready; absent otherwise
    (KubeRay >= 1.3, where it mirrors the ``Ready`` condition)."""
    conditions: tuple[Condition, ...] = ()
    applications: tuple[AppStatus, ...] = ()
    endpoint: str | None = None
    """The public URL from the release's Ingress or HTTPRoute; ``None``: none found."""
    replicas_error: str | None = None
    """Why the replica counts are unknown (the dashboard call failed), else ``None``."""
    endpoint_error: str | None = None
    """Why the endpoint is unknown (the lookup failed), else ``None``."""

    @property
    def ready(self) -> bool:
        """KubeRay's ``Ready`` condition when reported, else ``serviceStatus == Running``."""
        for condition in self.conditions:
            if condition.type == "Ready":
                return condition.status == "True"
        return self.service_status == "Running"

    @property
    def healthy(self) -> bool:
        """Ready, and every Serve application (at least one) ``RUNNING``."""
        apps = self.applications
        return self.ready and bool(apps) and all(app.status == "RUNNING" for app in apps)


@dataclass(frozen=True, slots=True)
class ContextStatus:
    """What one kube context shows: its regions, or why it could not be read."""

    context: str
    reachable: bool
    """Whether the API server answered at all (a refusal such as HTTP 403 is reachable)."""
    error: str | None
    """Why the RayServices could not be listed; ``None`` when they were."""
    regions: tuple[RegionStatus, ...] = ()

    @property
    def healthy(self) -> bool:
        """Read without error and every region healthy (no region at all counts as healthy)."""
        return self.error is None and all(region.healthy for region in self.regions)

    def to_json(self) -> dict[str, Json]:
        """The ``--output json`` object of this context: these fields, each region's
        fields (nested dataclasses as objects, tuples as arrays) plus ``ready`` and
        ``healthy``. Called by the CLI."""
        return {
            "context": self.context,
            "reachable": self.reachable,
            "error": self.error,
            "healthy": self.healthy,
            "regions": [
                {**asdict(region), "ready": region.ready, "healthy": region.healthy}
                for region in self.regions
            ],
        }


class ReplicaCount(NamedTuple):
    """One deployment's replicas per the Ray dashboard."""

    running: int
    target: int | None
    status: str | None


def replicas_from_dashboard(body: Json) -> dict[tuple[str, str], ReplicaCount]:
    """Replica counts by (application, deployment) from the Ray dashboard's
    ``GET /api/serve/applications/`` body (Ray's ``ServeInstanceDetails``):
    ``applications.<app>.deployments.<dep>`` has ``status``, ``target_num_replicas`` and
    ``replicas`` (a list of objects with a ``state``); only ``RUNNING`` ones count."""
    counts: dict[tuple[str, str], ReplicaCount] = {}
    for app_name, app in as_map(as_map(body).get("applications")).items():
        for dep_name, dep in as_map(as_map(app).get("deployments")).items():
            fields = as_map(dep)
            replicas = as_list(fields.get("replicas"))
            running = sum(1 for r in replicas if as_map(r).get("state") == "RUNNING")
            target = fields.get("target_num_replicas")
            counts[(app_name, dep_name)] = ReplicaCount(
                running,
                target if isinstance(target, int) and not isinstance(target, bool) else None,
                _text(fields.get("status")),
            )
    return counts


def region_from_rayservice(
    item: Json,
    *,
    replicas: Mapping[tuple[str, str], ReplicaCount],
    replicas_error: str | None = None,
    endpoint: str | None = None,
    endpoint_error: str | None = None,
) -> RegionStatus:
    """The :class:`RegionStatus` of one RayService list item, its deployments' replica
    counts taken from ``replicas`` (see :func:`replicas_from_dashboard`)."""
    metadata = as_map(as_map(item).get("metadata"))
    labels = as_map(metadata.get("labels"))
    status = as_map(as_map(item).get("status"))
    name = _text(metadata.get("name")) or ""
    conditions = tuple(
        Condition(
            type=str(fields.get("type", "")),
            status=str(fields.get("status", "Unknown")),
            reason=_text(fields.get("reason")) or "",
            message=_text(fields.get("message")) or "",
        )
        for fields in map(as_map, as_list(status.get("conditions")))
    )
    app_statuses = as_map(as_map(status.get("activeServiceStatus")).get("applicationStatuses"))
    apps = tuple(
        _app(app_name, as_map(app), replicas) for app_name, app in sorted(app_statuses.items())
    )
    return RegionStatus(
        region=_text(labels.get(REGION_LABEL)) or name,
        namespace=_text(metadata.get("namespace")) or "",
        name=name,
        release=_text(labels.get(INSTANCE_LABEL)),
        service_status=_text(status.get("serviceStatus")),
        conditions=conditions,
        applications=apps,
        endpoint=endpoint,
        replicas_error=replicas_error,
        endpoint_error=endpoint_error,
    )


def _app(
    name: str, fields: dict[str, Json], replicas: Mapping[tuple[str, str], ReplicaCount]
) -> AppStatus:
    kuberay = as_map(fields.get("serveDeploymentStatuses"))
    names = set(kuberay) | {dep for app, dep in replicas if app == name}
    deployments = []
    for dep_name in sorted(names):
        dep = as_map(kuberay.get(dep_name))
        count = replicas.get((name, dep_name))
        deployments.append(
            DeploymentStatus(
                name=dep_name,
                status=_text(dep.get("status")) or (count.status if count else None),
                message=_text(dep.get("message")) or "",
                running_replicas=count.running if count else None,
                target_replicas=count.target if count else None,
            )
        )
    return AppStatus(
        name=name,
        status=_text(fields.get("status")),
        message=_text(fields.get("message")) or "",
        deployments=tuple(deployments),
    )


def endpoint_from_ingresses(items: Iterable[Json]) -> str | None:
    """``https://<host>`` of the first Ingress rule host listed in that Ingress's
    ``spec.tls[].hosts``, else ``http://<host>``; ``None`` when no rule has a host."""
    for ingress in items:
        spec = as_map(as_map(ingress).get("spec"))
        tls_hosts = {
            host for tls in as_list(spec.get("tls")) for host in as_list(as_map(tls).get("hosts"))
        }
        for rule in as_list(spec.get("rules")):
            host = _text(as_map(rule).get("host"))
            if host is not None:
                return f"https://{host}" if host in tls_hosts else f"http://{host}"
    return None


def endpoint_from_httproutes(items: Iterable[Json]) -> str | None:
    """``https://<first hostname>`` of the first HTTPRoute that lists ``spec.hostnames``."""
    for route in items:
        for hostname in as_list(as_map(as_map(route).get("spec")).get("hostnames")):
            host = _text(hostname)
            if host is not None:
                return f"https://{host}"
    return None
