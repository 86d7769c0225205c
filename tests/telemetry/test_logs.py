"""``telemetry.log_level`` on Firstlight's own loggers (``firstlight.telemetry.logs``): the
level, the terminal sink (through whatever ``sys.stderr`` is at the time), the Serve
replica sink (through the handlers of Ray Serve's ``ray.serve`` logger), and that a
second call replaces the first. Nothing here starts Ray."""

from __future__ import annotations

import contextvars
import json
import logging
import logging.handlers
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from firstlight.config import parse_config
from firstlight.telemetry.logs import LOGGER_NAME, bind_request, configure_logging
from tests.api.fake_region import MODEL, fake_gateway, gateway_config


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def _restore_loggers() -> Iterator[None]:
    """Leave the ``firstlight`` and ``ray.serve`` loggers as the test found them."""
    saved = {
        name: (logging.getLogger(name).level, list(logging.getLogger(name).handlers))
        for name in (LOGGER_NAME, "ray.serve")
    }
    yield
    for name, (level, handlers) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers[:] = handlers


def test_the_configured_level_decides_what_reaches_the_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = parse_config({"telemetry": {"log_level": "debug"}}, "test")
    configure_logging(config.telemetry.log_level)
    logging.getLogger("firstlight.hints.store").debug("mirror refreshed")
    assert "DEBUG firstlight.hints.store: mirror refreshed" in capsys.readouterr().err

    configure_logging("warning")
    child = logging.getLogger("firstlight.serve.app")
    child.info("quiet at warning")
    child.warning("heard at warning")
    err = capsys.readouterr().err
    assert "quiet at warning" not in err
    assert "WARNING firstlight.serve.app: heard at warning" in err


def test_a_second_call_replaces_the_handler_instead_of_adding_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info")
    configure_logging("info")
    logging.getLogger("firstlight.x").info("once")
    assert capsys.readouterr().err.count("once") == 1


def test_in_a_serve_replica_records_go_through_serves_own_handlers_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Serve's throughput-optimized replicas buffer 1000 records in a MemoryHandler."""
    serve_logger = logging.getLogger("ray.serve")
    collect = Collect()
    serve_logger.handlers[:] = [logging.handlers.MemoryHandler(1000, target=collect)]
    configure_logging("debug", sink="serve-replica")
    logging.getLogger("firstlight.engine.vllm_engine").debug("engine args ready")
    messages = [(r.levelname, r.getMessage()) for r in collect.records]
    assert ("DEBUG", "firstlight.engine.vllm_engine: engine args ready") in messages
    assert "engine args ready" not in capsys.readouterr().err


def test_an_unknown_level_is_refused_by_field_name() -> None:
    level: Any = "verbose"
    with pytest.raises(ValueError, match=r"telemetry\.log_level: unknown level 'verbose'"):
        configure_logging(level)


def test_a_json_record_of_a_request_carries_its_ids(capsys: pytest.CaptureFixture[str]) -> None:
    contextvars.copy_context().run(_json_record_of_a_request, capsys)


def _json_record_of_a_request(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", log_format="json")
    logger = logging.getLogger("firstlight.api.dispatch")
    logger.info("before any request")
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("chat m") as span:
        bound = bind_request("chatcmpl-1", span)
        logger.warning("attempt %d failed", 1)
    before, during = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert (before["request_id"], before["trace_id"], before["span_id"]) == (None, None, None)
    assert before["message"] == "before any request"
    context = span.get_span_context()
    assert during == {
        "time": during["time"],
        "level": "warning",
        "logger": "firstlight.api.dispatch",
        "message": "attempt 1 failed",
        "request_id": "chatcmpl-1",
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
    }
    assert (bound.trace_id, bound.span_id) == (during["trace_id"], during["span_id"])
    assert during["time"].endswith("+00:00")


def test_a_text_line_of_a_request_ends_with_its_ids_and_a_replicas_starts_with_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    contextvars.copy_context().run(_text_lines_of_a_request, capsys)


def _text_lines_of_a_request(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    bind_request("cmpl-7")  # traces off: no span, so no trace id
    logging.getLogger("firstlight.x").info("resumed")
    assert capsys.readouterr().err.rstrip().endswith("firstlight.x: resumed [request=cmpl-7]")
    serve_logger = logging.getLogger("ray.serve")
    collect = Collect()
    serve_logger.handlers[:] = [collect]
    configure_logging("info", sink="serve-replica")
    logging.getLogger("firstlight.y").info("served")
    assert collect.records[-1].getMessage() == "firstlight.y: [request=cmpl-7] served"


async def test_every_log_line_of_a_request_through_the_gateway_carries_its_ids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A replica fails before any output: the gateway's warning about it, written deep in
    the request's handling, names the request and its trace."""
    async with fake_gateway(gateway_config()) as gw:
        gw.core.telemetry.tracer = TracerProvider().get_tracer("test")
        configure_logging("info", log_format="json")
        gw.backend.fail_next(MODEL)
        response = await gw.client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 200, response.text
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    mine = [line for line in lines if line["logger"].startswith("firstlight.api")]
    assert any("failed before any output" in line["message"] for line in mine), lines
    for line in mine:
        assert line["request_id"] == response.json()["id"]
        assert len(line["trace_id"]) == 32
        assert len(line["span_id"]) == 16


def test_in_a_json_replica_the_ids_are_the_records_own_fields() -> None:
    contextvars.copy_context().run(_json_replica)


def _json_replica() -> None:
    serve_logger = logging.getLogger("ray.serve")
    collect = Collect()
    serve_logger.handlers[:] = [collect]
    configure_logging("info", sink="serve-replica", log_format="json")
    bind_request("cmpl-8")
    logging.getLogger("firstlight.y").info("served")
    [record] = collect.records
    assert record.getMessage() == "firstlight.y: served"  # Serve's JSON has the ids
    assert (record.request_id, record.trace_id) == ("cmpl-8", None)
