"""The Firstlight exception tree.

Every error the platform raises on purpose derives from :class:`FirstlightError`, so a
caller (the CLI, the gateway) can tell our errors from bugs. Third-party exceptions are
translated at the boundary that calls the library, with ``raise ... from exc``::

    FirstlightError
    ├── ConfigError               configuration file, value or environment override is invalid
    ├── ModelPreparationError     the default model cannot be located, converted or verified
    ├── ProfilingError            ``firstlight profile`` cannot start or profile anything
    ├── HintsError                prefix-cache hints: a bad argument to a hints component
    │   ├── InvalidBlockEventError    a block event is malformed (hash out of range, bad epoch)
    │   ├── HintPublishError          a batch of block events could not be written to Redis
    │   └── StaleEpochError           a publisher's epoch is older than the one Redis holds
    └── EngineError               an inference engine refused or failed a request
        ├── UnsupportedEngineConfigError  a quantization/speculative mode the device lacks
        ├── ModelNotFoundError        the model folder does not exist or does not load
        │   └── ModelSourceError          a hf:// or s3:// source cannot be fetched (token,
        │                                 missing repository/object, no space in the cache)
        ├── InvalidRequestError       bad request for this engine (gateway: HTTP 400)
        │   └── PromptTooLongError        prompt + completion exceed max_model_len
        └── EngineDeadError           the engine process died or stopped (gateway: 503)
    └── ApiError                  the gateway refuses an HTTP request (status + OpenAI body)
        ├── BadRequestError           malformed or invalid request body (400)
        ├── AuthenticationError       missing or unknown API key (401)
        ├── PermissionDeniedError     a known key that may not open this path (403)
        ├── ModelNotServedError       ``model`` is not served here (404)
        ├── RequestTooLargeError      the request body exceeds the gateway's limit (413)
        ├── RateLimitedError          over a limit (429, with Retry-After)
        └── NoCapacityError           no healthy replica here or in any peer (503)

Later subsystems add their branches here (routing, engines, API errors), so the
whole tree stays readable in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ApiError",
    "AuthenticationError",
    "BadRequestError",
    "ConfigError",
    "ConfigProblem",
    "EngineDeadError",
    "EngineError",
    "FirstlightError",
    "HintPublishError",
    "HintsError",
    "InvalidBlockEventError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "ModelNotServedError",
    "ModelPreparationError",
    "ModelSourceError",
    "NoCapacityError",
    "PermissionDeniedError",
    "ProfilingError",
    "PromptTooLongError",
    "RateLimitedError",
    "RequestTooLargeError",
    "StaleEpochError",
    "UnsupportedEngineConfigError",
]


class FirstlightError(Exception):
    """Base class of every error Firstlight raises deliberately."""


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration.

    ``path`` is the field's dotted path with list indices (``regions[1].peers[0].region``),
    empty for problems with the document as a whole; ``value`` is the offending input
    (``None`` when there is none, e.g. a missing field).
    """

    path: str
    message: str
    value: object = None
    has_value: bool = False

    def __str__(self) -> str:
        where = self.path or "<config>"
        if self.has_value:
            return f"{where} = {self.value!r}: {self.message}"
        return f"{where}: {self.message}"


class ConfigError(FirstlightError):
    """A configuration could not be loaded; ``problems`` lists every issue found.

    Raised by :func:`firstlight.config.load_config` and
    :func:`firstlight.config.parse_config`; the CLI prints each problem and exits 2.
    """

    def __init__(self, problems: list[ConfigProblem], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        head = f"invalid configuration in {source}" if source else "invalid configuration"
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{head}:\n{lines}")


class ProfilingError(FirstlightError):
    """``firstlight profile`` cannot start: no Ray cluster answers, the region is not
    running there or has no live replica, py-spy is not installed, the output folder
    cannot be written, or no process of the region could be profiled. The message is
    one line, for the CLI to print as it is."""


class ModelPreparationError(FirstlightError):
    """The default model could not be located, converted or verified.

    Raised by :func:`firstlight.engine.default_model.prepare_default_model`; the message
    says what to install or delete to fix it.
    """


class HintsError(FirstlightError):
    """Base of the prefix-cache hints errors; raised as itself for a bad constructor
    argument of a hints component (``ttl_s = 0``, an empty ``model``), with the value."""


class InvalidBlockEventError(HintsError):
    """A :class:`~firstlight.hints.BlockEvent` is malformed: empty replica id, negative
    epoch, or a block hash outside ``[0, 2**64)``; or it was handed to the publisher of
    another replica or epoch.

    Raised by ``BlockEvent(...)`` and :meth:`firstlight.hints.HintPublisher.publish`. The
    subscriber never raises it: a malformed feed entry is skipped and counted.
    """


class HintPublishError(HintsError):
    """A batch of block events could not be written to Redis (unreachable, timed out,
    or Redis answered with an error). The batch is lost; the next batch, or the periodic
    re-announcement of resident blocks, repairs the hints.

    Raised by :meth:`firstlight.hints.HintPublisher.publish` and ``start_epoch``, ``from``
    the Redis or timeout exception.
    """


class StaleEpochError(HintsError):
    """Redis holds a newer epoch for this replica than the publisher's: a newer
    incarnation of the replica has started, so this publisher's blocks are stale and were
    not written. ``epoch`` is the publisher's, ``current_epoch`` the one in Redis.

    Raised by :meth:`firstlight.hints.HintPublisher.publish` and ``start_epoch``; the
    caller should stop publishing.
    """

    def __init__(self, replica_id: str, epoch: int, current_epoch: int) -> None:
        self.replica_id = replica_id
        self.epoch = epoch
        self.current_epoch = current_epoch
        super().__init__(
            f"replica {replica_id!r}: epoch {epoch} is stale, Redis holds epoch {current_epoch}"
        )


class EngineError(FirstlightError):
    """An inference engine refused or failed a request (base of the engine branch)."""


class UnsupportedEngineConfigError(EngineError):
    """The model's quantization or speculative-decoding mode is not supported on this
    device; raised before the engine starts, naming what is supported."""


class ModelNotFoundError(EngineError):
    """The model folder does not exist or does not load."""


class ModelSourceError(ModelNotFoundError):
    """A model's ``hf://`` or ``s3://`` source could not be fetched into the node's
    cache: the hub refused the token, the repository, revision, bucket or objects are
    missing, access is denied, the cache's file system has no room, or (for the
    gateway's tokenizer) the source lacks tokenizer files. Raised by
    :func:`firstlight.sources.ensure_model_dir` and
    :func:`~firstlight.sources.ensure_tokenizer_dir`; the message names the model, the
    source and what to fix (the token's variable, the URL, the folder and the bytes
    needed, the missing files)."""


class InvalidRequestError(EngineError):
    """The request is invalid for this engine (e.g. ``max_tokens`` < 1); HTTP 400.
    ``param`` names the request field when one is to blame."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[object, ...]:
        # A replica raises it and Ray pickles it to the gateway: keep ``param``.
        return (InvalidRequestError, (str(self), self.param))


class PromptTooLongError(InvalidRequestError):
    """Prompt plus requested completion exceed the model's ``max_model_len``."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"the prompt has {prompt_tokens} tokens and {max_tokens} more were requested, "
            f"but this model's context is {max_model_len} tokens"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (PromptTooLongError, (self.prompt_tokens, self.max_tokens, self.max_model_len))


class EngineDeadError(EngineError):
    """The engine died or was shut down; its requests cannot complete (HTTP 503)."""


class ApiError(FirstlightError):
    """An HTTP request the gateway refuses, rendered in OpenAI's error shape
    (``{"error": {"message", "type", "param", "code"}}``) with ``status``.

    Raised by the gateway's request handling (:mod:`firstlight.api`) and turned into a
    response at one place, :func:`firstlight.api.errors.error_response`. Subclasses fix the
    status and type; ``param`` names the offending request field where there is one.
    """

    status = 500
    error_type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        super().__init__(message)


class BadRequestError(ApiError):
    """The request body is malformed or invalid (HTTP 400)."""

    status = 400
    error_type = "invalid_request_error"


class AuthenticationError(ApiError):
    """No API key, or not an accepted one (HTTP 401)."""

    status = 401
    error_type = "authentication_error"


class PermissionDeniedError(ApiError):
    """A known key that may not open this path: a client key on an operator surface
    (HTTP 403)."""

    status = 403
    error_type = "permission_error"


class ModelNotServedError(ApiError):
    """The requested ``model`` is not served by this platform (HTTP 404)."""

    status = 404
    error_type = "invalid_request_error"


class RequestTooLargeError(ApiError):
    """The request body is larger than the gateway accepts (HTTP 413)."""

    status = 413
    error_type = "invalid_request_error"


class RateLimitedError(ApiError):
    """The caller is over a limit (HTTP 429 with ``Retry-After``)."""

    status = 429
    error_type = "rate_limit_error"


class NoCapacityError(ApiError):
    """No healthy replica of the model here, and no peer region could take the request
    (HTTP 503 with ``Retry-After``)."""

    status = 503
    error_type = "service_unavailable"
