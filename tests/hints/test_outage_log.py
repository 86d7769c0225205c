"""The background Redis tasks' outage log (:class:`firstlight.hints._redis.OutageLog`):
one warning per outage, one line when it ends, however many tries fail between."""

from __future__ import annotations

import logging

import pytest

from firstlight.hints._redis import OutageLog


def test_an_outage_is_logged_once_at_its_start_and_once_at_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("firstlight.test.outage")
    outage = OutageLog(log, "replica r1: hints", "routers miss its blocks")
    with caplog.at_level(logging.INFO, logger=log.name):
        outage.ok()
        for _ in range(5):
            outage.failed(ConnectionError("refused"))
        assert outage.up is False
        outage.ok()
        outage.ok()
        outage.failed(TimeoutError("late"))
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            "WARNING",
            "replica r1: hints: Redis fails (ConnectionError: refused); routers miss its blocks",
        ),
        ("INFO", "replica r1: hints: Redis works again"),
        ("WARNING", "replica r1: hints: Redis fails (TimeoutError: late); routers miss its blocks"),
    ]
