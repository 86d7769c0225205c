"""The Ray side of watching a local platform start: Ray Serve's status as the typed
records of :mod:`firstlight.serve.startup`, the cluster's log folder, and a failed
replica's own output file.

Used by :func:`firstlight.serve.local_mode.start_local` only: it builds one
:class:`StartupWatch` before deploying and calls :meth:`StartupWatch.check` on every
poll while it waits for the regions' ``/readyz``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

from firstlight.serve.startup import (
    ApplicationStatusRecord,
    DeploymentStatusRecord,
    RayLogs,
    StartupFailure,
    error_text,
    needs_root_cause,
    startup_failures,
    startup_notes,
)

__all__ = ["StartupWatch", "ray_logs", "serve_status"]

_log = logging.getLogger(__name__)

_WORKER_LOG_TAIL_BYTES = 65_536
"""How much of a failed replica's output file is read for the root cause (its end)."""


def ray_logs() -> RayLogs | None:
    """Where this process's Ray cluster writes its logs; ``None`` before ``ray.init``.

    Ray 2.60 has no public call for the session folder: this reads the node object
    that Ray Serve itself uses to place its log files (``get_serve_logs_dir``)."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    if node is None:
        return None
    return RayLogs(Path(node.get_logs_dir_path()))


def serve_status() -> tuple[ApplicationStatusRecord, ...] | None:
    """``ray.serve.status()`` as typed records; ``None`` when Serve's controller did not
    answer this time (the next poll asks again)."""
    import ray
    from ray import serve

    try:
        status = serve.status()
    except ray.exceptions.RayError as exc:
        _log.debug("serve.status() failed: %s", exc)
        return None
    return tuple(
        ApplicationStatusRecord(
            name=name,
            status=_value(app.status),
            message=app.message or "",
            deployments=tuple(
                DeploymentStatusRecord(d_name, _value(d.status), d.message or "")
                for d_name, d in app.deployments.items()
            ),
        )
        for name, app in status.applications.items()
    )


def _value(status: Any) -> str:
    """An enum member's value (Serve's statuses are ``str`` enums), or the string."""
    return str(getattr(status, "value", status))


class StartupWatch:
    """Serve's status for the regions being started. Built before the deploy: the
    failures present then (a former run's, not yet replaced) are ignored."""

    def __init__(self, regions: Collection[str], logs: RayLogs | None) -> None:
        self.logs = logs
        self._regions = tuple(regions)
        self._notes: set[tuple[str, str, str]] = set()
        before = serve_status() or ()
        self._ignore = {f.key for f in startup_failures(before, self._regions)}

    def check(self, report: Callable[[str], None]) -> tuple[StartupFailure, ...]:
        """The regions' failed deployments (each with its replica's output file and, for a
        vLLM engine core that died, the root cause read from it); reports Serve's new
        notes (slow replicas) through ``report`` meanwhile."""
        apps = serve_status()
        if apps is None:
            return ()
        failures = startup_failures(apps, self._regions, ignore=self._ignore)
        if failures:
            return tuple(_with_worker_log(f, self.logs) for f in failures)
        for note in startup_notes(apps, self._regions):
            key = (note.region, note.deployment, note.text)
            if key not in self._notes:
                self._notes.add(key)
                report(f"region {note.region}, {note.deployment}: {note.text}")
        return ()


def _with_worker_log(failure: StartupFailure, logs: RayLogs | None) -> StartupFailure:
    """``failure`` with its replica process's output file (``worker-*-<pid>.err``) and,
    when :func:`needs_root_cause` says so, the last error in it."""
    if logs is None or failure.replica_pid is None:
        return failure
    try:
        found = sorted(
            logs.logs_dir.glob(f"worker-*-{failure.replica_pid}.err"),
            key=lambda path: path.stat().st_mtime,
        )
        if not found:
            return failure
        root_cause = None
        if needs_root_cause(failure):
            with found[-1].open("rb") as file:
                size = file.seek(0, 2)
                file.seek(max(0, size - _WORKER_LOG_TAIL_BYTES))
                root_cause = error_text(file.read().decode("utf-8", "replace")) or None
    except OSError as exc:  # the file is Ray's: rotated or removed meanwhile
        _log.debug("replica output of pid %s unreadable: %s", failure.replica_pid, exc)
        return failure
    return replace(failure, worker_log=found[-1], root_cause=root_cause)
