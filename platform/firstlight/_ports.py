"""A free TCP port, for whatever starts a server of its own: the local data plane's
HAProxy side listeners (:mod:`firstlight.serve.data_plane`), the benchmarks that start
servers, and tests. Kept out of :mod:`firstlight.serve`, whose package imports Ray."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` now (``""``: every interface); the
    caller binds it soon after, so another process taking it first is unlikely, not
    impossible."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
