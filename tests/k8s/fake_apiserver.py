"""A loopback stand-in for a Kubernetes API server, for the ``firstlight status`` tests.

No Kubernetes cluster can run on these machines, so :func:`serving` starts one stdlib
``ThreadingHTTPServer`` on 127.0.0.1 (port 0) per :class:`FakeCluster` to stand in for its
API server. It serves only the read-only paths ``firstlight status`` uses, with JSON
shaped like the real API: a ``RayServiceList``, an ``IngressList``, an ``HTTPRouteList``
(filtered by ``labelSelector`` and namespace, as the API server does) and, through the
service-proxy path, the Ray dashboard's ``GET /api/serve/applications/`` body. It answers
401 without the cluster's bearer token, 404 with a ``Status`` body for any other path
(and for HTTPRoutes when ``httproutes`` is ``None``: Gateway API not installed), 405 for
any method but GET, and records every request in ``FakeCluster.requests``. While
``FakeCluster.hold`` is set, it answers nothing until that event is set (a hung server).
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

ROUTES = {
    "rayservices": re.compile(r"^/apis/ray\.io/v1(?:/namespaces/(?P<ns>[^/]+))?/rayservices$"),
    "ingresses": re.compile(r"^/apis/networking\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/ingresses$"),
    "httproutes": re.compile(
        r"^/apis/gateway\.networking\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/httproutes$"
    ),
    "dashboard": re.compile(
        r"^/api/v1/namespaces/(?P<ns>[^/]+)/services/(?P<svc>[^/:]+):8265"
        r"/proxy/api/serve/applications/$"
    ),
}
LIST_KINDS = {
    "rayservices": ("ray.io/v1", "RayServiceList"),
    "ingresses": ("networking.k8s.io/v1", "IngressList"),
    "httproutes": ("gateway.networking.k8s.io/v1", "HTTPRouteList"),
}
Request = tuple[str, str, dict[str, list[str]]]
"""(method, path, decoded query) of one request the server received."""


@dataclass
class FakeCluster:
    """What one stand-in API server holds; :func:`serving` sets ``url``."""

    token: str
    rayservices: list[dict[str, Any]] = field(default_factory=list)
    ingresses: list[dict[str, Any]] = field(default_factory=list)
    httproutes: list[dict[str, Any]] | None = None
    dashboards: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    """(namespace, head service) -> (HTTP status, body; ``None``: a ``Status`` body)."""
    requests: list[Request] = field(default_factory=list)
    url: str = ""
    hold: threading.Event | None = None
    """When set, every request waits for this event (at most 10 s) before any answer."""

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the request threads: none outlive a test

    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.cluster = cluster

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a held request answers a client that gave up: a broken pipe, as expected


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        cluster = self.server.cluster
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        cluster.requests.append(("GET", url.path, query))
        if cluster.hold is not None:
            cluster.hold.wait(timeout=10)
        if self.headers.get("Authorization") != f"Bearer {cluster.token}":
            return self._status(401, "Unauthorized")
        for route, pattern in ROUTES.items():
            match = pattern.match(url.path)
            if match is None:
                continue
            if route == "dashboard":
                code, body = cluster.dashboards.get((match["ns"], match["svc"]), (404, None))
                if body is None:
                    return self._status(code, "no endpoints available for service")
                return self._send(code, body)
            items = getattr(cluster, route)
            if items is None:
                break
            api_version, kind = LIST_KINDS[route]
            return self._send(
                200,
                {
                    "kind": kind,
                    "apiVersion": api_version,
                    "metadata": {"resourceVersion": "4711"},
                    "items": [i for i in items if _selected(i, match["ns"], query)],
                },
            )
        return self._status(404, "the server could not find the requested resource")

    def do_POST(self) -> None:
        self._refuse()

    def do_PUT(self) -> None:
        self._refuse()

    def do_PATCH(self) -> None:
        self._refuse()

    def do_DELETE(self) -> None:
        self._refuse()

    def _refuse(self) -> None:
        self.server.cluster.requests.append((self.command, urlsplit(self.path).path, {}))
        self._status(405, "method not allowed")

    def _status(self, code: int, message: str) -> None:
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        self._send(code, {**status, "message": message, "code": code})

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _selected(item: dict[str, Any], namespace: str | None, query: dict[str, list[str]]) -> bool:
    metadata = item["metadata"]
    if namespace is not None and metadata["namespace"] != namespace:
        return False
    terms = [t for s in query.get("labelSelector", []) for t in s.split(",") if t]
    labels = metadata.get("labels", {})
    return all(labels.get(k) == v for k, v in (t.split("=", 1) for t in terms))


@contextmanager
def serving(clusters: Mapping[str, FakeCluster]) -> Iterator[None]:
    """Serve every cluster on its own loopback port until the block exits."""
    servers = [_Server(cluster) for cluster in clusters.values()]
    threads = [
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}) for s in servers
    ]
    for cluster, server, thread in zip(clusters.values(), servers, threads, strict=True):
        cluster.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread.start()
    try:
        yield
    finally:
        for server, thread in zip(servers, threads, strict=True):
            server.shutdown()
            server.server_close()
            thread.join()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def write_kubeconfig(path: Path, servers: Mapping[str, tuple[str, str]]) -> Path:
    """A kubeconfig with one context per name -> (server URL, bearer token), in order."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": next(iter(servers)),
        "clusters": [{"name": n, "cluster": {"server": url}} for n, (url, _) in servers.items()],
        "users": [{"name": f"{n}-admin", "user": {"token": t}} for n, (_, t) in servers.items()],
        "contexts": [{"name": n, "context": {"cluster": n, "user": f"{n}-admin"}} for n in servers],
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
