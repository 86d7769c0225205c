"""What Ray Serve says while a local platform starts: which deployment failed, and the
engine's own words for why.

Pure (no Ray import), so the rules are tested as a table. Each poll,
:func:`~firstlight.serve.local_mode.start_local` turns ``ray.serve.status()`` into
:class:`ApplicationStatusRecord`\\ s and calls:

* :func:`startup_failures` — the deployments (or applications) of the platform's regions
  that failed; ``start_local`` raises ``StartupError`` on the first one, with
  :func:`failure_report` as its message;
* :func:`startup_notes` — Serve's other messages (a replica slow to initialize or to be
  scheduled), reported once each as progress.

Why the first failed replica, not ``DEPLOY_FAILED``: Ray Serve 2.60 retries a replica
whose constructor raised up to three times per replica before it marks the deployment
``DEPLOY_FAILED``, and only then the application; with a vLLM engine each attempt can
take a minute. After the *first* failure the deployment stays ``UPDATING`` but its
``message`` already reads ``A replica failed to start with exception. Retrying N more
time(s). Error:`` followed by the replica's traceback (``record_replica_startup_failure``
in Serve's ``deployment_state.py``). That message is the earliest reliable signal: a
constructor that raised once (a missing model folder, an engine that cannot start) raises
again, so start-up stops there.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "ApplicationStatusRecord",
    "DeploymentStatusRecord",
    "RayLogs",
    "StartupFailure",
    "StartupNote",
    "error_text",
    "failure_report",
    "logs_line",
    "needs_root_cause",
    "startup_failures",
    "startup_notes",
]

FAILED_STATUSES: Final = frozenset({"DEPLOY_FAILED", "UNHEALTHY"})
"""Serve's deployment and application statuses that mean the start failed."""
_RETRYING_PREFIXES: Final = (
    "A replica failed to start",
    "A deployment actor failed to start",
)
"""How Serve's message starts after a failed start it is about to retry."""
_ROOT_CAUSE_PHRASE: Final = "see root cause above"
"""vLLM's words when its engine-core process failed: the cause is in that process's
output (the replica's worker log), not in the exception."""

_ANSI: Final = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_EXCEPTION_LINE: Final = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)"
    r"(?:\([\w.]+\))?(?::|$)"
)
"""A traceback's last line: ``module.Name: message`` (or Ray's ``RayTaskError(Name):``)."""
_BLOCK_END: Final = re.compile(
    r"^(?:$|\s*File \"|Traceback \(most recent call last\)|During handling|The above "
    r"exception|ray::)"
)
_PID: Final = re.compile(r"\(pid=(\d+),")


@dataclass(frozen=True)
class DeploymentStatusRecord:
    """One deployment of ``ray.serve.status()``."""

    name: str
    status: str
    """Serve's ``DeploymentStatus`` value: ``UPDATING``, ``HEALTHY``, ``UNHEALTHY``,
    ``DEPLOY_FAILED``, ``UPSCALING``, ``DOWNSCALING``."""
    message: str


@dataclass(frozen=True)
class ApplicationStatusRecord:
    """One application (a region, in local mode) of ``ray.serve.status()``."""

    name: str
    status: str
    """Serve's ``ApplicationStatus`` value: ``NOT_STARTED``, ``DEPLOYING``, ``RUNNING``,
    ``DEPLOY_FAILED``, ``UNHEALTHY``, ``DELETING``."""
    message: str
    deployments: tuple[DeploymentStatusRecord, ...] = ()


@dataclass(frozen=True)
class StartupFailure:
    """A region's deployment (or the region's application itself) that failed to start."""

    region: str
    deployment: str | None
    """``None`` when the application failed as a whole (no deployment says why)."""
    status: str
    retrying: bool
    """Serve is about to retry the replica (the first failure); ``False``: it gave up."""
    error: str
    """The error's own lines from Serve's message (:func:`error_text`)."""
    message: str
    """Serve's whole message: with region and deployment, what makes a failure new."""
    replica_pid: int | None = None
    """The failed replica's process id, from the traceback's ``(pid=...)`` header."""
    worker_log: Path | None = None
    """That process's own output (stderr), when ``start_local`` found the file."""
    root_cause: str | None = None
    """The last error in ``worker_log``, when :func:`needs_root_cause` said to look."""

    @property
    def key(self) -> tuple[str, str | None, str]:
        """What tells this failure from one seen before deploying (a former run's)."""
        return (self.region, self.deployment, self.message)


@dataclass(frozen=True)
class StartupNote:
    """A Serve message worth showing while waiting (a slow replica, say)."""

    region: str
    deployment: str
    text: str


@dataclass(frozen=True)
class RayLogs:
    """Where a local Ray cluster writes its logs."""

    logs_dir: Path
    """``<session folder>/logs``: every Ray process's output (``worker-*.err``/``.out``)."""

    @property
    def serve_dir(self) -> Path:
        """Serve's own logs: the controller's, the proxy's and one file per replica."""
        return self.logs_dir / "serve"


def startup_failures(
    apps: Sequence[ApplicationStatusRecord],
    regions: Collection[str],
    *,
    ignore: Collection[tuple[str, str | None, str]] = (),
) -> tuple[StartupFailure, ...]:
    """The failures among the applications named in ``regions``, in their order.

    A deployment failed when its status is in :data:`FAILED_STATUSES` or its message
    says a replica failed to start (Serve is retrying it); an application failed when
    its own status is failed and none of its deployments says why. Failures whose
    :attr:`StartupFailure.key` is in ``ignore`` (seen before this deploy) are left out.
    Called by ``start_local`` on every poll.
    """
    found: list[StartupFailure] = []
    for app in apps:
        if app.name not in regions:
            continue
        in_app: list[StartupFailure] = []
        for deployment in app.deployments:
            retrying = deployment.message.startswith(_RETRYING_PREFIXES)
            if deployment.status in FAILED_STATUSES or retrying:
                in_app.append(
                    _failure(app.name, deployment.name, deployment.status, deployment.message)
                )
        if not in_app and app.status in FAILED_STATUSES:
            in_app.append(_failure(app.name, None, app.status, app.message))
        found.extend(f for f in in_app if f.key not in ignore)
    return tuple(found)


def _failure(region: str, deployment: str | None, status: str, message: str) -> StartupFailure:
    text = _ANSI.sub("", message)
    pid = _PID.search(text)
    return StartupFailure(
        region=region,
        deployment=deployment,
        status=status,
        retrying=status not in FAILED_STATUSES,
        error=error_text(text) or f"(Serve gave no message; status {status})",
        message=message,
        replica_pid=int(pid.group(1)) if pid else None,
    )


def startup_notes(
    apps: Sequence[ApplicationStatusRecord], regions: Collection[str]
) -> tuple[StartupNote, ...]:
    """Serve's messages about deployments still starting (not failures): for instance
    ``... has 1 replicas that have taken more than 30s to initialize`` or ``... to be
    scheduled`` (then with the resources asked and available). Called by
    ``start_local`` on every poll; it reports each note once."""
    notes: list[StartupNote] = []
    for app in apps:
        if app.name not in regions:
            continue
        for deployment in app.deployments:
            message = deployment.message.strip()
            if (
                message
                and deployment.status not in FAILED_STATUSES
                and not message.startswith(_RETRYING_PREFIXES)
            ):
                text = " ".join(line.strip() for line in _ANSI.sub("", message).splitlines())
                notes.append(StartupNote(app.name, deployment.name, _clip(text, 400)))
    return tuple(notes)


def error_text(text: str, *, max_lines: int = 8, max_line_chars: int = 400) -> str:
    """The last error a traceback names, with the lines of its message: from the last
    ``Name: message`` line (``firstlight.errors.ModelNotFoundError: ...``) to the end of
    that exception's text, at most ``max_lines`` lines of ``max_line_chars`` characters.
    Ray's wrapper line (``RuntimeError: Traceback (most recent call last):``) is skipped.
    Without any such line: the last ``max_lines`` non-empty lines. Used for Serve's
    messages and for a replica's worker log."""
    lines = [line.rstrip() for line in _ANSI.sub("", text).splitlines()]
    start = None
    for i, line in enumerate(lines):
        if _EXCEPTION_LINE.match(line) and not _wraps_traceback(line):
            start = i
    if start is None:
        chosen = [line for line in lines if line.strip()][-max_lines:]
    else:
        chosen = [lines[start]]
        for line in lines[start + 1 :]:
            if _BLOCK_END.match(line):
                break
            chosen.append(line)
    clipped = [_clip(line, max_line_chars) for line in chosen[:max_lines]]
    if len(chosen) > max_lines:
        clipped.append("...")
    return "\n".join(clipped)


def _wraps_traceback(line: str) -> bool:
    _, _, rest = line.partition(":")
    return rest.strip().startswith("Traceback (most recent call last)")


def _clip(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def needs_root_cause(failure: StartupFailure) -> bool:
    """Whether ``failure``'s cause is only in its replica's worker log: vLLM reports an
    engine-core process that died while starting as ``Engine core initialization failed.
    See root cause above.``; the cause went to that process's stderr."""
    return _ROOT_CAUSE_PHRASE in failure.error.lower()


def failure_report(failures: Sequence[StartupFailure], logs: RayLogs | None) -> str:
    """The ``StartupError`` message: each failure with its error lines and its log files
    (Serve's file of the deployment's replicas, the failed process's own output), then
    the cluster's log folder. Called by ``start_local``."""
    if all(f.retrying for f in failures):
        parts = ["a replica failed to start (Ray Serve would retry it; start-up stops here):"]
    else:
        parts = ["Ray Serve reports a failed deployment:"]
    for failure in failures:
        where = f"region {failure.region}"
        if failure.deployment is not None:
            where += f", deployment {failure.deployment}"
        if not failure.retrying:
            where += f" ({failure.status})"
        parts.append(f"{where}:\n{_indent(failure.error)}")
        if failure.root_cause is not None and failure.worker_log is not None:
            parts.append(f"  root cause, from {failure.worker_log}:\n{_indent(failure.root_cause)}")
        files = _log_files(failure, logs)
        if files:
            parts.append(f"  logs: {', '.join(files)}")
    parts.append(logs_line(logs))
    return "\n".join(parts)


def _log_files(failure: StartupFailure, logs: RayLogs | None) -> list[str]:
    files: list[str] = []
    if logs is not None and failure.deployment is not None:
        files.append(str(logs.serve_dir / f"replica_{failure.region}_{failure.deployment}_*.log"))
    if failure.worker_log is not None:
        files.append(str(failure.worker_log))
    elif logs is not None and failure.replica_pid is not None:
        files.append(str(logs.logs_dir / f"worker-*-{failure.replica_pid}.err"))
    return files


def logs_line(logs: RayLogs | None) -> str:
    """One line saying where the full logs are (every ``StartupError`` ends with it)."""
    if logs is None:
        return "Full logs: in the Ray cluster's session folder (logs/, and logs/serve/ in it)."
    return f"Full logs: {logs.logs_dir} (Ray Serve's own: {logs.serve_dir})"


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())
