"""Read-only status of Firstlight's regions across kube contexts.

``firstlight status`` (:mod:`firstlight.k8s.cli`) calls :func:`kubeconfig_path`,
:func:`resolve_contexts` and :func:`collect_status`; they return dataclasses and print
nothing. For each context, through that context's API server and only with GETs:

1. RayServices (``ray.io/v1``) labelled ``app.kubernetes.io/name=firstlight``: the region
   label, KubeRay's ``status.serviceStatus`` and ``status.conditions``, and the Serve
   application and deployment statuses KubeRay copies into
   ``status.activeServiceStatus.applicationStatuses``;
2. replica counts, which KubeRay does not record, from the Ray dashboard's
   ``GET /api/serve/applications/`` through the API server's service proxy (the path
   ``kubectl proxy`` uses) on port 8265 of the active cluster's head service;
3. the public endpoint: an Ingress, else a Gateway API HTTPRoute, labelled
   ``app.kubernetes.io/instance=<release>`` in the RayService's namespace.

A context whose API server cannot be reached or refuses the RayService list becomes a
:class:`ContextStatus` carrying the error, never an exception; a failed dashboard or
endpoint lookup leaves that field unknown with its reason. Only a missing or unreadable
kubeconfig, or an unknown context name, raise (:class:`KubeconfigError`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import urllib3
import yaml
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException, new_client_from_config

from firstlight.errors import FirstlightError
from firstlight.k8s._model import (
    FIRSTLIGHT_SELECTOR,
    INSTANCE_LABEL,
    AppStatus,
    Condition,
    ContextStatus,
    DeploymentStatus,
    Json,
    RegionStatus,
    as_list,
    as_map,
    endpoint_from_httproutes,
    endpoint_from_ingresses,
    region_from_rayservice,
    replicas_from_dashboard,
)

__all__ = [
    "DASHBOARD_PORT",
    "FIRSTLIGHT_SELECTOR",
    "AppStatus",
    "Condition",
    "ContextStatus",
    "DeploymentStatus",
    "KubeconfigError",
    "RegionStatus",
    "collect_status",
    "context_status",
    "kubeconfig_path",
    "resolve_contexts",
]

DASHBOARD_PORT = 8265
"""Port of the Ray dashboard (and its Serve REST API) on the head service."""
_MAX_CONTEXTS_IN_FLIGHT = 16


class KubeconfigError(FirstlightError):
    """The kubeconfig is missing or unreadable, or has no context of a requested name."""


class _RequestError(Exception):
    """One GET failed; ``http_status`` is the answer's status, ``None`` when none came."""

    def __init__(self, message: str, *, http_status: int | None) -> None:
        super().__init__(message)
        self.http_status = http_status

    @property
    def reachable(self) -> bool:
        return self.http_status is not None


def kubeconfig_path(explicit: Path | None) -> str:
    """The kubeconfig to read: ``explicit``, else ``$KUBECONFIG`` (paths joined by
    ``os.pathsep``, merged as the kubernetes client does), else ``~/.kube/config``.

    Called by the CLI before :func:`resolve_contexts`; raises nothing."""
    raw = str(explicit) if explicit is not None else os.environ.get("KUBECONFIG", "")
    parts = [os.path.expanduser(p) for p in (raw or "~/.kube/config").split(os.pathsep) if p]
    return os.pathsep.join(parts)


def resolve_contexts(kubeconfig: str, requested: Sequence[str] = ()) -> list[str]:
    """The contexts to query: ``requested`` (deduplicated, in order) or, when empty, every
    context of ``kubeconfig`` in file order.

    Called by the CLI. Raises :class:`KubeconfigError` when no file of ``kubeconfig``
    exists, one is not a readable YAML kubeconfig, or a requested name is unknown."""
    names: list[str] = []
    paths = [p for p in kubeconfig.split(os.pathsep) if p]
    if not any(os.path.isfile(p) for p in paths):
        raise KubeconfigError(f"kubeconfig not found: {kubeconfig}")
    for path in filter(os.path.isfile, paths):
        try:
            with open(path, encoding="utf-8") as file:
                document = yaml.safe_load(file)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise KubeconfigError(f"cannot read kubeconfig {path}: {exc}") from exc
        if not isinstance(document, dict):
            raise KubeconfigError(f"cannot read kubeconfig {path}: not a kubeconfig mapping")
        for entry in as_list(document.get("contexts")):
            name = as_map(entry).get("name")
            if isinstance(name, str) and name not in names:
                names.append(name)
    unknown = [name for name in requested if name not in names]
    if unknown:
        known = ", ".join(names) or "none"
        raise KubeconfigError(
            f"no context named {', '.join(unknown)} in {kubeconfig} (contexts: {known})"
        )
    if not names:
        raise KubeconfigError(f"kubeconfig {kubeconfig} defines no contexts")
    return list(dict.fromkeys(requested)) or names


def collect_status(
    contexts: Sequence[str], kubeconfig: str, *, namespace: str | None, timeout_s: float
) -> list[ContextStatus]:
    """:func:`context_status` of every context, queried concurrently (the kubernetes
    client blocks), returned in the order of ``contexts``.

    Called by the CLI after :func:`resolve_contexts`; raises nothing for unreachable or
    misconfigured contexts (they come back with ``error`` set)."""
    if not contexts:
        return []
    workers = min(len(contexts), _MAX_CONTEXTS_IN_FLIGHT)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="k8s-status") as pool:
        futures = [
            pool.submit(context_status, c, kubeconfig, namespace=namespace, timeout_s=timeout_s)
            for c in contexts
        ]
        return [future.result() for future in futures]


def context_status(
    context: str, kubeconfig: str, *, namespace: str | None, timeout_s: float
) -> ContextStatus:
    """Every Firstlight region one kube context serves (all namespaces unless
    ``namespace``), each of its calls bounded by ``timeout_s``.

    Called by :func:`collect_status` from a worker thread; never raises for the
    cluster's or the kubeconfig entry's failures: they are the result's ``error``."""
    try:
        client = _api_client(kubeconfig, context)
    except (ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        # e.g. a missing client certificate file or a failing exec credential plugin
        return ContextStatus(context, reachable=False, error=f"kubeconfig: {exc}")
    with client:
        cluster = _Cluster(client, timeout_s)
        where = f"/namespaces/{_segment(namespace)}" if namespace else ""
        try:
            listing = cluster.get_json(
                f"/apis/ray.io/v1{where}/rayservices", [("labelSelector", FIRSTLIGHT_SELECTOR)]
            )
        except _RequestError as exc:
            return ContextStatus(context, reachable=exc.reachable, error=str(exc))
        endpoints: dict[tuple[str, str], tuple[str | None, str | None]] = {}
        regions = [_region(cluster, item, endpoints) for item in as_list(listing.get("items"))]
    regions.sort(key=lambda r: (r.region, r.namespace, r.name))
    return ContextStatus(context, reachable=True, error=None, regions=tuple(regions))


def _api_client(kubeconfig: str, context: str) -> ApiClient:
    configuration = Configuration()
    # urllib3 retries 3 times by default, which would multiply every deadline by 4.
    configuration.retries = False
    # persist_config=False: a read-only command must not rewrite the user's kubeconfig.
    # kubernetes ships py.typed but leaves its config loaders unannotated.
    client: ApiClient = new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig,
        context=context,
        persist_config=False,
        client_configuration=configuration,
    )
    return client


class _Cluster:
    """GETs JSON from one API server, each call bounded by ``timeout_s``."""

    def __init__(self, client: ApiClient, timeout_s: float) -> None:
        self._client = client
        self._timeout = (timeout_s, timeout_s)  # (connect, read)

    def get_json(self, path: str, query: Sequence[tuple[str, str]] = ()) -> dict[str, Json]:
        # Built by hand rather than through connect_get_namespaced_service_proxy_with_path,
        # which percent-encodes the '/' of the proxied path and turns JSON into a str repr.
        try:
            method, url, headers, _, _ = self._client.param_serialize(
                "GET",
                path,
                query_params=list(query) or None,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],  # refreshes exec/OIDC tokens when they expire
            )
        except (ConfigException, OSError, ValueError) as exc:
            raise _RequestError(f"credentials: {exc}", http_status=None) from exc
        try:
            response = self._client.call_api(method, url, headers, _request_timeout=self._timeout)
            body: bytes = response.read()  # type: ignore[no-untyped-call]  # unannotated
        except ApiException as exc:  # the client's translation of TLS failures (status 0)
            reason = str(exc.reason).replace("\n", ": ")  # "SSLError\n[SSL: ...] ..."
            raise _RequestError(f"TLS: {reason}", http_status=None) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _RequestError(f"{type(exc).__name__}: {exc}", http_status=None) from exc
        if not 200 <= response.status < 300:
            detail = as_map(_parse(body)).get("message")
            useful = isinstance(detail, str) and detail and detail != response.reason
            suffix = f": {detail}" if useful else ""
            message = f"GET {path}: HTTP {response.status} {response.reason}{suffix}"
            raise _RequestError(message, http_status=response.status)
        document = _parse(body)
        if not isinstance(document, dict):
            message = f"GET {path}: the response is not a JSON object"
            raise _RequestError(message, http_status=response.status)
        return document


def _parse(body: bytes) -> Json:
    try:
        document: Json = json.loads(body)
    except ValueError:
        return None
    return document


def _segment(name: str) -> str:
    return quote(name, safe="")


def _region(
    cluster: _Cluster,
    item: Json,
    endpoints: dict[tuple[str, str], tuple[str | None, str | None]],
) -> RegionStatus:
    metadata = as_map(as_map(item).get("metadata"))
    name = str(metadata.get("name", ""))
    namespace = str(metadata.get("namespace", ""))
    # KubeRay records the active RayCluster's head service; it also creates
    # <name>-head-svc for every RayService, pointing at the same head.
    active = as_map(as_map(as_map(item).get("status")).get("activeServiceStatus"))
    head = as_map(as_map(active.get("rayClusterStatus")).get("head"))
    head_service = head.get("serviceName")
    if not isinstance(head_service, str) or not head_service:
        head_service = f"{name}-head-svc"
    dashboard_path = (
        f"/api/v1/namespaces/{_segment(namespace)}/services/{_segment(head_service)}"
        f":{DASHBOARD_PORT}/proxy/api/serve/applications/"
    )
    try:
        replicas, replicas_error = replicas_from_dashboard(cluster.get_json(dashboard_path)), None
    except _RequestError as exc:
        replicas, replicas_error = {}, f"Ray dashboard: {exc}"
    release = as_map(metadata.get("labels")).get(INSTANCE_LABEL)
    endpoint: str | None = None
    endpoint_error: str | None = None
    if isinstance(release, str):
        key = (namespace, release)
        if key not in endpoints:
            endpoints[key] = _endpoint(cluster, namespace, release)
        endpoint, endpoint_error = endpoints[key]
    return region_from_rayservice(
        item,
        replicas=replicas,
        replicas_error=replicas_error,
        endpoint=endpoint,
        endpoint_error=endpoint_error,
    )


def _endpoint(cluster: _Cluster, namespace: str, release: str) -> tuple[str | None, str | None]:
    """(URL, None), or (None, why it is unknown); (None, None) when nothing routes to it."""
    selector = [("labelSelector", f"{INSTANCE_LABEL}={release}")]
    base = f"/namespaces/{_segment(namespace)}"
    try:
        ingresses = cluster.get_json(f"/apis/networking.k8s.io/v1{base}/ingresses", selector)
    except _RequestError as exc:
        return None, f"Ingress: {exc}"
    found = endpoint_from_ingresses(as_list(ingresses.get("items")))
    if found is not None:
        return found, None
    try:
        routes = cluster.get_json(f"/apis/gateway.networking.k8s.io/v1{base}/httproutes", selector)
    except _RequestError as exc:
        if exc.http_status == 404:  # Gateway API not installed: no HTTPRoute can exist
            return None, None
        return None, f"HTTPRoute: {exc}"
    return endpoint_from_httproutes(as_list(routes.get("items"))), None
