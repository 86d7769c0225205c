"""Firstlight's own logs: the ``firstlight`` logger hierarchy at ``telemetry.log_level``.

:func:`configure_logging` is called once per process, as soon as the configuration is
known:

* by ``firstlight up`` and ``firstlight serve`` (:mod:`firstlight.cli`) with the default
  ``sink="stderr"``: records go to the terminal, through whatever ``sys.stderr`` is when
  they are written, so they land above a progress display instead of through it;
* at the top of the ``Gateway`` and ``ModelServer`` constructors
  (:mod:`firstlight.serve.gateway_deployment`, :mod:`firstlight.serve.model_server`)
  with ``sink="serve-replica"``: records go through the handlers Ray Serve gave its own
  ``ray.serve`` logger in that replica, so they land in the replica's Serve log file
  (``<Ray session>/logs/serve/replica_<region>_<deployment>_<id>.log``) beside Serve's
  lines, with the replica's name on each, at once (Serve's buffer is flushed).

Only the ``firstlight`` loggers are touched: Ray's, vLLM's and the root logger keep
their own settings.
"""

from __future__ import annotations

import logging
import sys
from typing import Final, Literal, TextIO

__all__ = ["LOGGER_NAME", "LogLevel", "LogSink", "configure_logging"]

LogLevel = Literal["debug", "info", "warning", "error"]
"""The values of ``telemetry.log_level``."""
LogSink = Literal["stderr", "serve-replica"]
"""Where :func:`configure_logging` sends records (see the module docstring)."""

LOGGER_NAME: Final = "firstlight"
"""The root of Firstlight's logger hierarchy (every module logs to ``__name__``)."""
_SERVE_LOGGER_NAME: Final = "ray.serve"
"""The logger Ray Serve configures in each replica (documented as the one to log to)."""
_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_LEVELS: Final[dict[LogLevel, int]] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

_log = logging.getLogger(__name__)


class _CurrentStderrHandler(logging.StreamHandler[TextIO]):
    """Writes to ``sys.stderr`` as it is at each record (rich's live display swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class _ServeLogHandler(logging.Handler):
    """Hands each record, its logger's name put before the message (Serve's format shows
    only the replica's), to the handlers of Ray Serve's ``ray.serve`` logger, then flushes
    them: in its throughput-optimized mode (Firstlight's default data plane) Serve holds a
    replica's records in a buffer of 1000, flushed early only by an error, and
    Firstlight's few records would otherwise show up minutes late or not at all."""

    def emit(self, record: logging.LogRecord) -> None:
        serve_logger = logging.getLogger(_SERVE_LOGGER_NAME)
        named = logging.makeLogRecord(record.__dict__)
        named.msg, named.args = f"{record.name}: {record.getMessage()}", None
        serve_logger.handle(named)
        for handler in serve_logger.handlers:
            handler.flush()


def configure_logging(level: LogLevel, *, sink: LogSink = "stderr") -> None:
    """Set the ``firstlight`` logger to ``level`` and give it one handler for ``sink``.

    Idempotent: a second call replaces the handler the first installed. The records
    still propagate to the root logger, so a handler there (pytest's log capture) sees
    them too. Raises ``ValueError`` naming ``telemetry.log_level`` for a level outside
    :data:`LogLevel`.
    """
    if level not in _LEVELS:
        known = ", ".join(_LEVELS)
        raise ValueError(f"telemetry.log_level: unknown level {level!r}; known: {known}")
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(_LEVELS[level])
    for old in list(logger.handlers):
        if isinstance(old, _CurrentStderrHandler | _ServeLogHandler):
            logger.removeHandler(old)
    handler: logging.Handler
    if sink == "serve-replica":
        handler = _ServeLogHandler()
    else:
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(handler)
    _log.debug("firstlight loggers at level %s, to %s", level, sink)
