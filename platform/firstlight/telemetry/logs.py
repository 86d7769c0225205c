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

Request context: the gateway binds each request it handles (:func:`bind_request`, once
per request, when its id is known); every record written in that request's task then
carries ``request_id``, and ``trace_id`` / ``span_id`` of the request's span when traces
are on (W3C hex). ``telemetry.log_format: json`` writes each record as one JSON object
(:class:`JsonFormatter`); ``text`` appends ``[request=... trace=...]`` to the line. In a
Serve replica, Serve writes the line: with ``json`` the deployments ask Serve for JSON
(:func:`firstlight.serve.app.serve_logging_options`), whose lines carry the ids as fields
of their own; with ``text`` the ids are put before the message, as Serve's text format
shows only its own fields.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal, TextIO

from opentelemetry import trace

__all__ = [
    "LOGGER_NAME",
    "JsonFormatter",
    "LogFormat",
    "LogLevel",
    "LogSink",
    "RequestLogContext",
    "bind_request",
    "configure_logging",
]

LogLevel = Literal["debug", "info", "warning", "error"]
"""The values of ``telemetry.log_level``."""
LogSink = Literal["stderr", "serve-replica"]
"""Where :func:`configure_logging` sends records (see the module docstring)."""
LogFormat = Literal["text", "json"]
"""The values of ``telemetry.log_format``."""

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


@dataclass(frozen=True, slots=True)
class RequestLogContext:
    """The ids a request's log records carry."""

    request_id: str
    trace_id: str | None = None
    """32 hex digits (W3C), ``None`` when the request's span records nothing."""
    span_id: str | None = None


_REQUEST: contextvars.ContextVar[RequestLogContext | None] = contextvars.ContextVar(
    "firstlight_request_log", default=None
)


def bind_request(request_id: str, span: trace.Span | None = None) -> RequestLogContext:
    """Bind ``request_id`` (and ``span``'s trace and span ids, when it has a valid
    context) to the records written from here on in this task and the tasks it starts.
    Called by the gateway once per request, when the request's id is known."""
    context = span.get_span_context() if span is not None else None
    valid = context is not None and context.is_valid
    bound = RequestLogContext(
        request_id,
        trace.format_trace_id(context.trace_id) if valid and context else None,
        trace.format_span_id(context.span_id) if valid and context else None,
    )
    _REQUEST.set(bound)
    return bound


class _RequestFields(logging.Filter):
    """Puts the bound request's ids on each record (``None`` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        bound = _REQUEST.get()
        record.request_id = bound.request_id if bound else None
        record.trace_id = bound.trace_id if bound else None
        record.span_id = bound.span_id if bound else None
        return True


def _ids(record: logging.LogRecord) -> str:
    """``[request=... trace=... span=...]`` for a record of a request, else ``""``."""
    request_id = getattr(record, "request_id", None)
    if request_id is None:
        return ""
    parts = [f"request={request_id}"]
    trace_id = getattr(record, "trace_id", None)
    if trace_id is not None:
        parts += [f"trace={trace_id}", f"span={getattr(record, 'span_id', None)}"]
    return "[" + " ".join(parts) + "]"


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = _ids(record)
        return f"{line} {ids}" if ids else line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, the request's ``request_id`` / ``trace_id`` / ``span_id`` (``null``
    outside a request) and ``exception`` when the record has one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "trace_id": getattr(record, "trace_id", None),
            "span_id": getattr(record, "span_id", None),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


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

    def __init__(self, log_format: LogFormat) -> None:
        super().__init__()
        self.log_format = log_format

    def emit(self, record: logging.LogRecord) -> None:
        serve_logger = logging.getLogger(_SERVE_LOGGER_NAME)
        named = logging.makeLogRecord(record.__dict__)
        # Serve's JSON lines carry the ids as fields of their own (the record's
        # attributes); its text lines show only Serve's fields, so the ids go in front.
        ids = _ids(record) if self.log_format == "text" else ""
        prefix = f"{record.name}: {ids} " if ids else f"{record.name}: "
        named.msg, named.args = prefix + record.getMessage(), None
        serve_logger.handle(named)
        for handler in serve_logger.handlers:
            handler.flush()


def configure_logging(
    level: LogLevel, *, sink: LogSink = "stderr", log_format: LogFormat = "text"
) -> None:
    """Set the ``firstlight`` logger to ``level`` and give it one handler for ``sink``,
    writing ``log_format`` (on ``stderr``; a Serve replica's records take Serve's
    format, the request's ids before the message), each record of a request with its
    ids.

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
        handler = _ServeLogHandler(log_format)
    else:
        handler = _CurrentStderrHandler()
        handler.setFormatter(JsonFormatter() if log_format == "json" else _TextFormatter(_FORMAT))
    handler.addFilter(_RequestFields())
    logger.addHandler(handler)
    _log.debug("firstlight loggers at level %s, to %s", level, sink)
