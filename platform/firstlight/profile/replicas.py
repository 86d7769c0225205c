"""The processes of a region running in a Ray cluster: one per Ray Serve replica.

:func:`find_replica_processes` (called by :func:`firstlight.profile.record.profile_region`)
connects to the cluster and reads Ray's actor table; :func:`replica_processes` (pure) picks
the region's live replicas out of it. A region is the Serve application of its name
(:func:`firstlight.serve.app.region_app`): its ``gateway`` deployment and one
``model-<name>`` deployment per model; each replica is an actor named
``SERVE_REPLICA::<application>#<deployment>#<replica id>`` with its process id.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from firstlight.profile.errors import ProfilingError

__all__ = ["ReplicaProcess", "find_replica_processes", "replica_processes"]

_REPLICA_PREFIX = "SERVE_REPLICA::"
"""Ray Serve's prefix of a replica actor's name (``ray.serve._private.common``)."""


@dataclass(frozen=True)
class ReplicaProcess:
    """One live replica of a region and the process it runs in."""

    deployment: str
    """``gateway`` or ``model-<name>``."""
    replica_id: str
    """Ray Serve's id of the replica within its deployment."""
    pid: int
    """The process id on the replica's node."""
    node_ip: str = ""
    """The node's address, as Ray reports it."""
    local: bool = True
    """Whether the replica runs on this machine (py-spy can only attach here)."""

    @property
    def label(self) -> str:
        """``<deployment>#<replica id>``: how the CLI names the process."""
        return f"{self.deployment}#{self.replica_id}"

    @property
    def file_stem(self) -> str:
        """``<deployment>-<replica id>``, with anything unsafe in a file name replaced."""
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.deployment}-{self.replica_id}")


def replica_processes(
    actors: Iterable[Mapping[str, Any]], application: str, local_node_id: str
) -> tuple[ReplicaProcess, ...]:
    """The alive replicas of ``application`` among ``actors`` (rows of Ray's actor table:
    ``Name``, ``State``, ``Pid``, ``Address.NodeID``/``IPAddress``), sorted by deployment
    then replica id. Replicas still starting (no process id yet) are left out."""
    prefix = f"{_REPLICA_PREFIX}{application}#"
    found = []
    for actor in actors:
        name = str(actor.get("Name") or "")
        if not name.startswith(prefix) or actor.get("State") != "ALIVE":
            continue
        deployment, sep, replica_id = name[len(prefix) :].rpartition("#")
        pid = int(actor.get("Pid") or 0)
        if not sep or not deployment or pid <= 0:
            continue
        address = actor.get("Address") or {}
        found.append(
            ReplicaProcess(
                deployment=deployment,
                replica_id=replica_id,
                pid=pid,
                node_ip=str(address.get("IPAddress") or ""),
                local=address.get("NodeID") == local_node_id,
            )
        )
    return tuple(sorted(found, key=lambda p: (p.deployment != "gateway", p.deployment, p.label)))


def find_replica_processes(region: str, *, address: str = "auto") -> tuple[ReplicaProcess, ...]:
    """The processes of ``region``'s replicas in the Ray cluster at ``address``.

    Reuses this process's Ray connection when there is one (the tests); otherwise
    connects to the cluster and disconnects after reading (the cluster keeps running).
    Raises :class:`ProfilingError` when no cluster answers at ``address``, when no
    application named ``region`` runs there (the message lists those that do), or when
    the region has no live replica yet.
    """
    import ray

    connected_here = not ray.is_initialized()
    if connected_here:
        # Ray 2.60 notes on stderr that it found its token ("Token authentication is
        # enabled ..."): not for this command's user.
        logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
        try:
            ray.init(
                address=address,
                logging_level=logging.ERROR,  # errors still come as exceptions
                log_to_driver=False,
                configure_logging=False,
            )
        except (ConnectionError, ray.exceptions.RayError, TimeoutError) as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            # Ray sends its token (~/.ray/auth_token) to a cluster it found itself, never
            # to an address it was given.
            hint = (
                "" if address == "auto" else "; with token authentication set RAY_AUTH_MODE=token"
            )
            raise ProfilingError(
                f"no running Ray cluster found at address {address!r} "
                f"(start the platform with `firstlight up`{hint}): {first_line}"
            ) from exc
    try:
        applications = _serve_applications()
        if region not in applications:
            running = ", ".join(sorted(applications)) or "none"
            raise ProfilingError(
                f"region {region!r} is not running in the Ray cluster at {_gcs_address()} "
                f"(Serve applications running: {running}); pass --address for another one"
            )
        # Ray's public state API (ray.util.state) asks the dashboard, which local mode
        # does not start; the actor table comes from the cluster's GCS directly.
        try:
            actors = ray._private.state.actors().values()
        except ray.exceptions.RayError as exc:
            raise ProfilingError(f"cannot read the Ray cluster's actors: {exc}") from exc
        local_node = ray.get_runtime_context().get_node_id()
        processes = replica_processes(actors, region, local_node)
    finally:
        if connected_here:
            ray.shutdown()
    if not processes:
        raise ProfilingError(f"region {region!r} has no live replica yet (still starting?)")
    return processes


def _gcs_address() -> str:
    """The connected cluster's address (what ``--address`` takes): with several local
    clusters, ``auto`` picks one, and the message must say which."""
    import ray

    node = getattr(ray._private.worker.global_worker, "node", None)
    return str(getattr(node, "gcs_address", None) or "unknown address")


def _serve_applications() -> set[str]:
    """The names of the Serve applications running in the connected cluster (empty when
    Serve is not running there)."""
    import ray
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        return set(serve.status().applications)
    except (ray.exceptions.RayError, RayServeException):
        return set()
