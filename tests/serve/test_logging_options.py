"""``telemetry.log_format`` in a Serve replica (``firstlight.serve.app``): with ``json``
the deployments ask Serve for JSON lines, which carry a record's extra attributes (the
request's ids) as fields; with ``text`` Serve keeps its default. Builds options, starts
no Ray."""

from __future__ import annotations

from ray import serve

from firstlight.config import parse_config
from firstlight.serve.app import serve_logging_options


@serve.deployment
class _Probe:
    pass


def test_json_asks_serve_for_json_lines_and_text_leaves_serves_default() -> None:
    json_config = parse_config({"telemetry": {"log_format": "json"}}, "test")
    deployment = _Probe.options(**serve_logging_options(json_config))
    assert deployment.logging_config["encoding"] == "JSON"
    text_config = parse_config({"telemetry": {"log_format": "text"}}, "test")
    assert serve_logging_options(text_config) == {}
    assert _Probe.options(**serve_logging_options(text_config)).logging_config is None
