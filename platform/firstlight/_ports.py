"""A free TCP port, for whatever starts a server of its own: the local data plane's
HAProxy side listeners (:mod:`firstlight.serve.data_plane`), the benchmarks that start
servers, and tests. Kept out of :mod:`firstlight.serve`, whose package imports Ray."""

from __future__ import annotations

import os
import socket

__all__ = ["free_port", "listener_of"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` now (``""``: every interface); the
    caller binds it soon after, so another process taking it first is unlikely, not
    impossible."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def listener_of(port: int) -> tuple[int, str] | None:
    """The process listening on TCP ``port`` (any address): its pid and command line,
    read from ``/proc`` (Linux; ``None`` elsewhere, when nothing listens, or when the
    process is another user's). Called by ``firstlight up`` when its port is taken, so
    the message can name what holds it — often an ingress a killed run left behind."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # LISTEN
                        inodes.add(inode)
        except OSError:
            continue
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    with os.scandir("/proc") as processes:
        pids = [entry.name for entry in processes if entry.name.isdigit()]
    for pid in pids:
        try:
            with os.scandir(f"/proc/{pid}/fd") as fds:
                links = {os.readlink(fd.path) for fd in fds}
            if links & wanted:
                with open(f"/proc/{pid}/cmdline", "rb") as raw:
                    argv = raw.read().rstrip(b"\0").split(b"\0")
                # The program's name and its arguments, its folder left out.
                words = [os.path.basename(argv[0]), *argv[1:]]
                return int(pid), b" ".join(words).decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return None
