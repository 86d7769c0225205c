"""Reading Ray Serve's status while a platform starts (``firstlight.serve.startup``): which
deployments failed, what counts as a note, and the error lines taken from a replica's
traceback. Pure: the messages below have the shape Ray Serve 2.60 writes (one real
start-up with a missing model folder, one with an unknown architecture and one with a
KV cache larger than memory), with neutral paths. Nothing here starts Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstlight.serve.startup import (
    ApplicationStatusRecord,
    DeploymentStatusRecord,
    RayLogs,
    StartupFailure,
    error_text,
    failure_report,
    needs_root_cause,
    startup_failures,
    startup_notes,
)

_HEADER = (
    "\x1b[36mray::ServeReplica:east:model-m.initialize_and_get_metadata()\x1b[39m "
    "(pid=8100, ip=192.0.2.2, actor_id=60cb, repr=<ServeReplica:east:model-m object>)"
)
_MISSING = (
    "firstlight.errors.ModelNotFoundError: model 'm': no model folder at /models/none "
    "(for the default model, run `firstlight prepare-model`)"
)
_TRACEBACK = f"""{_HEADER}
  File "/opt/venv/lib/python3.11/site-packages/ray/serve/_private/replica.py", line 1928, in initialize
    raise RuntimeError(traceback.format_exc()) from None
RuntimeError: Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/ray/serve/_private/replica.py", line 4008, in _call_func_or_gen
    result = callable(*args, **kwargs)
             ^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/app/firstlight/engine/vllm_engine.py", line 178, in create
    raise ModelNotFoundError(
{_MISSING}"""
RETRYING = (
    f"A replica failed to start with exception. Retrying 2 more time(s). Error:\n{_TRACEBACK}"
)
GAVE_UP = (
    "The deployment failed to start 3 times in a row. This may be due to a problem with its "
    f"constructor or initial health check failing. See controller logs for details. Error:\n{_TRACEBACK}"
)
SLOW = (
    "Deployment 'model-m' in application 'east' has 1 replicas that have taken more than 30s "
    "to initialize.\nThis may be caused by a slow __init__ or reconfigure method."
)
CHAINED = """Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/pydantic/_internal/_dataclasses.py", line 121, in __init__
    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)
pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
  Value error, Model architectures ['NopeForCausalLM'] are not supported for now.
    For further information visit https://errors.pydantic.dev/2.14/v/value_error

The above exception was the direct cause of the following exception:

\x1b[36mray::ServeReplica:east:model-m.initialize_and_get_metadata()\x1b[39m (pid=11000, ip=192.0.2.2)
  File "/opt/app/firstlight/engine/vllm_engine.py", line 262, in create
    raise EngineError(f"vLLM could not start model {model.name!r}: {exc}") from exc
firstlight.errors.EngineError: vLLM could not start model 'm': 1 validation error for ModelConfig
  Value error, Model architectures ['NopeForCausalLM'] are not supported for now.
    For further information visit https://errors.pydantic.dev/2.14/v/value_error"""
ENGINE_CORE = (
    "A replica failed to start with exception. Retrying 2 more time(s). Error:\n"
    "ray::ServeReplica:east:model-m.initialize_and_get_metadata() (pid=13337, ip=192.0.2.2)\n"
    '  File "/opt/app/firstlight/engine/vllm_engine.py", line 262, in create\n'
    "firstlight.errors.EngineError: vLLM could not start model 'm': Engine core "
    "initialization failed. See root cause above. Failed core proc(s): {}"
)


def dep(name: str, status: str = "UPDATING", message: str = "") -> DeploymentStatusRecord:
    return DeploymentStatusRecord(name, status, message)


def app(
    name: str, *deployments: DeploymentStatusRecord, status: str = "DEPLOYING", message: str = ""
) -> ApplicationStatusRecord:
    return ApplicationStatusRecord(name, status, message, deployments)


# (case, applications, expected failures as (region, deployment, status, retrying))
FAILURE_CASES = [
    ("still starting", [app("east", dep("model-m"), dep("gateway"))], []),
    ("running", [app("east", dep("model-m", "HEALTHY"), status="RUNNING")], []),
    (
        "first failed replica, Serve retrying",
        [app("east", dep("model-m", message=RETRYING), dep("gateway"))],
        [("east", "model-m", "UPDATING", True)],
    ),
    (
        "Serve gave up",
        [app("east", dep("model-m", "DEPLOY_FAILED", GAVE_UP), status="DEPLOY_FAILED")],
        [("east", "model-m", "DEPLOY_FAILED", False)],
    ),
    (
        "unhealthy",
        [app("east", dep("gateway", "UNHEALTHY", "health check failed"))],
        [("east", "gateway", "UNHEALTHY", False)],
    ),
    (
        "a deployment actor failed",
        [
            app(
                "east",
                dep(
                    "model-m",
                    message="A deployment actor failed to start. Retrying.\nValueError: x",
                ),
            )
        ],
        [("east", "model-m", "UPDATING", True)],
    ),
    (
        "the application failed without a deployment",
        [
            app(
                "east",
                status="DEPLOY_FAILED",
                message="Deploying app 'east' failed:\nImportError: no x",
            )
        ],
        [("east", None, "DEPLOY_FAILED", False)],
    ),
    (
        "a slow replica is a note, not a failure",
        [app("east", dep("model-m", message=SLOW))],
        [],
    ),
    (
        "another application's failure is not ours",
        [app("other", dep("model-m", "DEPLOY_FAILED", GAVE_UP), status="DEPLOY_FAILED")],
        [],
    ),
    (
        "every failed deployment of every region, in order",
        [
            app("east", dep("model-m", message=RETRYING), dep("gateway", message=RETRYING)),
            app("west", dep("model-m", message=RETRYING)),
        ],
        [
            ("east", "model-m", "UPDATING", True),
            ("east", "gateway", "UPDATING", True),
            ("west", "model-m", "UPDATING", True),
        ],
    ),
]


@pytest.mark.parametrize(
    ("apps", "expected"), [c[1:] for c in FAILURE_CASES], ids=[c[0] for c in FAILURE_CASES]
)
def test_failures(
    apps: list[ApplicationStatusRecord],
    expected: list[tuple[str, str | None, str, bool]],
) -> None:
    found = startup_failures(apps, ["east", "west"])
    assert [(f.region, f.deployment, f.status, f.retrying) for f in found] == expected


def test_a_failure_carries_the_engine_error_line_and_the_replica_pid() -> None:
    (failure,) = startup_failures([app("east", dep("model-m", message=RETRYING))], ["east"])
    assert failure.error == _MISSING
    assert failure.replica_pid == 8100
    assert failure.message == RETRYING


def test_a_failure_seen_before_the_deploy_is_ignored_but_a_new_one_is_not() -> None:
    before = [app("east", dep("model-m", "DEPLOY_FAILED", GAVE_UP), status="DEPLOY_FAILED")]
    ignore = {f.key for f in startup_failures(before, ["east"])}
    assert startup_failures(before, ["east"], ignore=ignore) == ()
    again = [app("east", dep("model-m", message=RETRYING.replace("8100", "8200")))]
    (failure,) = startup_failures(again, ["east"], ignore=ignore)
    assert failure.replica_pid == 8200


def test_notes_are_serve_messages_about_deployments_still_starting() -> None:
    apps = [
        app("east", dep("model-m", message=SLOW), dep("gateway", message=RETRYING)),
        app("other", dep("model-m", message=SLOW)),
    ]
    (note,) = startup_notes(apps, ["east"])
    assert (note.region, note.deployment) == ("east", "model-m")
    assert note.text.startswith("Deployment 'model-m' in application 'east' has 1 replicas")
    assert "\n" not in note.text


# (case, text, expected error_text)
ERROR_TEXT_CASES = [
    ("Ray's wrapper is skipped for the error it wraps", RETRYING, _MISSING),
    (
        "a chain: the outermost error, with its message's indented lines",
        CHAINED,
        "firstlight.errors.EngineError: vLLM could not start model 'm': 1 validation error for "
        "ModelConfig\n  Value error, Model architectures ['NopeForCausalLM'] are not supported "
        "for now.\n    For further information visit https://errors.pydantic.dev/2.14/v/value_error",
    ),
    (
        "Ray's task error header is not the error",
        "RayTaskError(RuntimeError): \x1b[36mray::HAProxyManager.ready()\x1b[39m (pid=1)\n"
        '  File "/opt/venv/ray/serve/_private/haproxy.py", line 2107, in _reload_haproxy\n'
        "RuntimeError: HAProxy crashed during startup: cannot bind socket",
        "RuntimeError: HAProxy crashed during startup: cannot bind socket",
    ),
    (
        "an exception without a message",
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\nKeyboardInterrupt',
        "KeyboardInterrupt",
    ),
    (
        "an error named unlike an exception: the last lines, never Ray's wrapper alone",
        'RuntimeError: Traceback (most recent call last):\n  File "x.py", line 1, in f\nmylib.Oops: it broke',
        'RuntimeError: Traceback (most recent call last):\n  File "x.py", line 1, in f\nmylib.Oops: it broke',
    ),
    ("no traceback: the last lines", "first\n\nsecond\nthird\n", "first\nsecond\nthird"),
    ("nothing", "", ""),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in ERROR_TEXT_CASES], ids=[c[0] for c in ERROR_TEXT_CASES]
)
def test_error_text(text: str, expected: str) -> None:
    assert error_text(text) == expected


def test_error_text_clips_long_lines_and_long_messages() -> None:
    text = "ValueError: " + "x" * 1000 + "\n" + "\n".join(f"  line {i}" for i in range(20))
    lines = error_text(text, max_lines=4, max_line_chars=50).splitlines()
    assert lines[0] == "ValueError: " + "x" * 35 + "..."
    assert lines[1:] == ["  line 0", "  line 1", "  line 2", "..."]


def test_only_vllms_engine_core_failure_needs_its_root_cause_from_the_worker_log() -> None:
    (core,) = startup_failures([app("east", dep("model-m", message=ENGINE_CORE))], ["east"])
    (missing,) = startup_failures([app("east", dep("model-m", message=RETRYING))], ["east"])
    assert needs_root_cause(core)
    assert core.replica_pid == 13337
    assert not needs_root_cause(missing)


def test_the_report_names_each_failure_its_error_and_where_the_logs_are() -> None:
    (failure,) = startup_failures([app("east", dep("model-m", message=RETRYING))], ["east"])
    logs = RayLogs(Path("/var/ray/session_1/logs"))
    report = failure_report([failure], logs)
    assert report.splitlines()[0].startswith("a replica failed to start")
    assert "region east, deployment model-m:\n    " + _MISSING in report
    assert "/var/ray/session_1/logs/serve/replica_east_model-m_*.log" in report
    assert "/var/ray/session_1/logs/worker-*-8100.err" in report
    assert report.splitlines()[-1] == (
        "Full logs: /var/ray/session_1/logs (Ray Serve's own: /var/ray/session_1/logs/serve)"
    )


def test_the_report_carries_the_root_cause_read_from_the_worker_log() -> None:
    worker_log = Path("/var/ray/session_1/logs/worker-ab-01000000-13337.err")
    failure = StartupFailure(
        region="east",
        deployment="model-m",
        status="DEPLOY_FAILED",
        retrying=False,
        error="EngineError: ... See root cause above.",
        message="...",
        replica_pid=13337,
        worker_log=worker_log,
        root_cause="RuntimeError: Worker failed with error 'not enough memory for kv'",
    )
    report = failure_report([failure], None)
    assert report.splitlines()[0] == "Ray Serve reports a failed deployment:"
    assert "region east, deployment model-m (DEPLOY_FAILED):" in report
    assert f"root cause, from {worker_log}:\n    RuntimeError: Worker failed" in report
    assert f"logs: {worker_log}" in report
    assert report.splitlines()[-1].startswith("Full logs: in the Ray cluster's session folder")
