"""``telemetry.log_level`` on Firstlight's own loggers (``firstlight.telemetry.logs``): the
level, the terminal sink (through whatever ``sys.stderr`` is at the time), the Serve
replica sink (through the handlers of Ray Serve's ``ray.serve`` logger), and that a
second call replaces the first. Nothing here starts Ray."""

from __future__ import annotations

import logging
import logging.handlers
from collections.abc import Iterator
from typing import Any

import pytest

from firstlight.config import parse_config
from firstlight.telemetry.logs import LOGGER_NAME, configure_logging


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
