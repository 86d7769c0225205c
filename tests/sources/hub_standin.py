"""A stand-in for the Hugging Face Hub: a real local HTTP server that speaks the subset
of the hub's API ``huggingface_hub`` 2.4's ``model_info`` and ``snapshot_download`` use,
serving repositories from local folders and enforcing a bearer token.

It is a stand-in (the hub itself cannot be reached here), written from the installed
``huggingface_hub``'s source:

* ``GET /api/models/{owner}/{name}/revision/{rev}`` (``?blobs=true``): the model's
  info, ``sha`` and ``siblings`` with sizes;
* ``GET /api/models/{owner}/{name}/tree/{rev}[/{path}]`` (``?recursive=true``): the
  files, without pagination (no ``Link`` header);
* ``HEAD``/``GET /{owner}/{name}/resolve/{rev}/{file}``: the file, with
  ``X-Repo-Commit``, ``ETag`` and ``Content-Length`` (no Xet headers, so the client
  downloads over plain HTTP).

Errors carry the hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``) and, for a token it does not know, the hub's 401 message
``Invalid credentials in Authorization header``, so ``huggingface_hub`` raises the
same exceptions it raises against the hub.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["HubStandIn", "StandInRepo", "running_hub"]


@dataclass(frozen=True)
class StandInRepo:
    """One repository: its files are ``folder``'s, at one commit that ``main`` (and the
    commit hash itself) resolve to; ``token`` is required when set."""

    folder: Path
    commit: str
    token: str | None = None

    def files(self) -> dict[str, Path]:
        return {
            str(p.relative_to(self.folder)): p
            for p in sorted(self.folder.rglob("*"))
            if p.is_file()
        }


@dataclass
class HubStandIn:
    """The server's state: its repositories and every request it answered."""

    repos: dict[str, StandInRepo]
    url: str = ""
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, Authorization header) of each request, in order."""


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        auth = self.headers.get("Authorization")
        self.hub.requests.append((self.command, path, auth))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo_id, kind, rev, rest = "/".join(parts[2:4]), parts[4], parts[5], parts[6:]
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, kind, rev, rest = "/".join(parts[:2]), "resolve", parts[3], parts[4:]
        else:
            self._error(404, "EntryNotFound", "no such endpoint on the stand-in")
            return
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return
        if repo.token is not None:
            if auth is None:
                # The hub answers a private repository without credentials as if it
                # did not exist.
                self._error(401, "RepoNotFound", "Invalid username or password.")
                return
            if auth != f"Bearer {repo.token}":
                self._error(401, None, "Invalid credentials in Authorization header")
                return
        if rev not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return
        if kind == "revision":
            self._json(self._info(repo_id, repo), body)
        elif kind == "tree":
            under = "/".join(rest)
            listing = [
                {"type": "file", "path": name, "size": p.stat().st_size, "oid": _sha1(p)}
                for name, p in repo.files().items()
                if name.startswith(under)
            ]
            self._json(listing, body)
        else:
            self._file(repo, "/".join(rest), body)

    def _info(self, repo_id: str, repo: StandInRepo) -> dict[str, object]:
        siblings = [
            {"rfilename": name, "size": p.stat().st_size, "blobId": _sha1(p)}
            for name, p in repo.files().items()
        ]
        return {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "siblings": siblings}

    def _file(self, repo: StandInRepo, name: str, body: bool) -> None:
        file = repo.files().get(name)
        if file is None:
            self._error(404, "EntryNotFound", f"{name} does not exist")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(file.stat().st_size))
        self.send_header("ETag", f'"{_sha1(file)}"')
        self.send_header("X-Repo-Commit", repo.commit)
        self.end_headers()
        if body:
            with file.open("rb") as stream:
                shutil.copyfileobj(stream, self.wfile)

    def _json(self, payload: object, body: bool) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str | None, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code is not None:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _sha1(path: Path) -> str:
    stat = path.stat()
    return _digest(path, stat.st_size, stat.st_mtime_ns)


@functools.cache
def _digest(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha1()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def running_hub(repos: dict[str, StandInRepo]) -> Iterator[HubStandIn]:
    """The stand-in hub serving ``repos`` on a free local port, for the ``with`` block."""
    hub = HubStandIn(repos)
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
