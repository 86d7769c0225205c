"""Typed platform configuration: one :class:`PlatformConfig` made of frozen sections.

Who uses it: the CLI (``firstlight config validate``, ``prepare-model``), and later the
Ray Serve app builders, the Helm values mapping and the benchmark. Everything else
receives the section it needs, already validated — no module reads its own environment
variables.

Sources, in increasing precedence:

1. defaults declared here (a one-region local setup serving the default model);
2. a YAML file (:func:`load_config`);
3. environment variables ``FIRSTLIGHT__<SECTION>__<FIELD>=<yaml value>``, with list
   indices as numbers, e.g. ``FIRSTLIGHT__ROUTER__POLICY=least_queue`` or
   ``FIRSTLIGHT__MODELS__0__REPLICAS=2``.

Every problem is reported at once as a :class:`~firstlight.errors.ConfigError` whose
problems name the field path and the offending value.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, HttpUrl, ValidationError, model_validator

from firstlight.errors import ConfigError, ConfigProblem

__all__ = [
    "ENV_PREFIX",
    "ApiKeyRef",
    "AuthConfig",
    "Dtype",
    "GatewayConfig",
    "HintsConfig",
    "ModelConfig",
    "PeerConfig",
    "PlatformConfig",
    "PolicyName",
    "RegionConfig",
    "ResourcesConfig",
    "RouterConfig",
    "SecretRef",
    "SloConfig",
    "SpeculativeConfig",
    "TelemetryConfig",
    "default_cache_dir",
    "load_config",
    "load_config_data",
    "parse_config",
    "validation_problems",
]

ENV_PREFIX = "FIRSTLIGHT__"
"""Prefix of environment variables that override configuration fields."""

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

EngineName = Literal["vllm", "sim"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
"""A model's weight and activation dtype (``auto``: the engine decides)."""

PolicyName = Literal[
    "firstlight",
    "round_robin",
    "random",
    "least_queue",
    "power_of_two",
    "cache_aware",
    "prefix_affinity",
    "weighted_scorer",
]
"""Routing policies a running platform can use. The benchmark's ``oracle`` arm reads the
true cache state, which only the simulator has, so it is not a platform policy."""

Quantization = Literal["awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes"]
SpeculativeMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "mtp"]

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
RegionName = Annotated[str, Field(pattern=_DNS_LABEL)]


def default_cache_dir() -> Path:
    """Where prepared models and other caches live: ``$XDG_CACHE_HOME/firstlight``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "firstlight"


class FieldValueError(ValueError):
    """Raised by cross-field validators: names the field (relative to the model being
    validated) and the offending value, so the report can print the full path."""

    def __init__(self, path: str, value: object, message: str) -> None:
        self.path = path
        self.value = value
        self.message = message
        super().__init__(f"{path} = {value!r}: {message}")


class _Section(BaseModel):
    """Base of every section: immutable, no unknown keys, attribute docstrings become
    field descriptions (shown by ``firstlight config reference``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class SecretRef(_Section):
    """A secret named by reference: an environment variable or a file, never inline."""

    env: Annotated[str | None, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")] = None
    """Name of an environment variable that holds the secret."""
    file: Path | None = None
    """Path of a file whose content (stripped of surrounding whitespace) is the secret,
    e.g. a mounted Kubernetes Secret."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.env is None) == (self.file is None):
            raise FieldValueError("env", self.env, "set exactly one of 'env' or 'file'")
        return self

    def resolve(self) -> str:
        """Return the secret's value; called by the component that needs it at start-up.

        Raises :class:`ConfigError` when the variable is unset or the file unreadable/empty.
        """
        if self.env is not None:
            value = os.environ.get(self.env, "")
            where, field, shown = f"environment variable {self.env}", "env", self.env
        else:
            assert self.file is not None
            field, shown = "file", str(self.file)
            where = f"file {self.file}"
            try:
                value = self.file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(
                    [ConfigProblem(field, f"cannot read secret: {exc.strerror}", shown, True)]
                ) from exc
        if not value:
            raise ConfigError([ConfigProblem(field, f"{where} is empty or unset", shown, True)])
        return value


class PeerConfig(_Section):
    """A peer region this region may spill over or fail over to."""

    region: RegionName
    """Name of the peer region; must be one of ``regions[].name``."""
    url: HttpUrl | None = None
    """Base URL of the peer's gateway (``https://eu-west.llm.example.com``). Required in
    ``kubernetes`` mode; in ``local`` mode the peer is reached on the shared HTTP proxy
    unless a URL is given (a proxy or fault injector in front of it, in tests)."""
    rtt_ms: Annotated[float, Field(ge=0, le=10_000)]
    """Round-trip time to the peer in milliseconds: the prior used until probes measure
    it, and the delay added to forwards when ``local`` mode emulates regions."""


class RegionConfig(_Section):
    """One region: an independent failure domain with its own replicas and Redis."""

    name: RegionName
    """Region name, a DNS label (``us-east``); appears in metrics and response headers."""
    peers: tuple[PeerConfig, ...] = ()
    """Regions this one may forward to (one hop at most)."""

    @model_validator(mode="after")
    def _peers_distinct(self) -> Self:
        seen: set[str] = set()
        for i, peer in enumerate(self.peers):
            if peer.region == self.name:
                raise FieldValueError(
                    f"peers[{i}].region", peer.region, "a region cannot be its own peer"
                )
            if peer.region in seen:
                raise FieldValueError(f"peers[{i}].region", peer.region, "peer listed twice")
            seen.add(peer.region)
        return self


class ResourcesConfig(_Section):
    """Resources Ray reserves for each replica of a model."""

    num_cpus: Annotated[float, Field(ge=0, le=1024)] = 1.0
    """CPU cores per replica (0 lets replicas share cores, as on a laptop)."""
    num_gpus: Annotated[float, Field(ge=0, le=64)] = 0.0
    """GPUs per replica (fractions share a GPU)."""
    memory_gib: Annotated[float | None, Field(gt=0, le=4096)] = None
    """Memory per replica in GiB; ``null`` leaves it unreserved."""


class SpeculativeConfig(_Section):
    """Speculative decoding, passed to the engine; support depends on the device."""

    method: SpeculativeMethod
    """Proposal method: ``ngram`` (prompt lookup), ``draft_model``, ``eagle``,
    ``eagle3`` or ``mtp``."""
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = 3
    """Tokens proposed per step."""
    draft_model: Annotated[str | None, Field(min_length=1)] = None
    """Local folder of the draft/EAGLE model; required for ``draft_model``, ``eagle``
    and ``eagle3``, not allowed otherwise."""
    prompt_lookup_max: Annotated[int | None, Field(ge=1, le=32)] = None
    """Longest n-gram matched in the prompt (``ngram`` only)."""

    @model_validator(mode="after")
    def _draft_model_matches_method(self) -> Self:
        needs_draft = self.method in ("draft_model", "eagle", "eagle3")
        if needs_draft and self.draft_model is None:
            raise FieldValueError("draft_model", None, f"required for method {self.method!r}")
        if not needs_draft and self.draft_model is not None:
            raise FieldValueError(
                "draft_model", self.draft_model, f"not used by method {self.method!r}"
            )
        if self.prompt_lookup_max is not None and self.method != "ngram":
            raise FieldValueError(
                "prompt_lookup_max", self.prompt_lookup_max, "only valid for method 'ngram'"
            )
        return self


class ModelConfig(_Section):
    """A model served in every region, with its engine settings."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
    """Name clients pass as ``model`` in OpenAI requests."""
    source: Annotated[str, Field(min_length=1)] = "default"
    """``default`` for SmolLM2-135M-Instruct prepared by ``firstlight prepare-model``,
    ``default-int8`` for its INT8 W8A8 variant (``prepare-model --quantize int8``; set
    ``quantization: compressed-tensors``), otherwise a local Hugging Face model folder
    (nothing is downloaded at run time)."""
    engine: EngineName = "vllm"
    """``vllm`` (real engine, CPU or GPU) or ``sim`` (simulator, results labelled
    simulated)."""
    sim_profile: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]{0,63}$")] = "cpu-smollm2-135m"
    """Simulator profile of an ``engine: sim`` model: ``cpu-smollm2-135m`` (the default
    model on a CPU), ``h100-llama-8b`` or ``instant`` (near-zero cost, for measuring the
    platform's own overhead). Ignored by ``vllm``."""
    dtype: Dtype = "bfloat16"
    """Weight and activation dtype. ``auto``: the model folder's, except for INT8 W8A8
    (``compressed-tensors``) on the CPU, where it is the dtype the processor's INT8
    kernel answers right with (bfloat16 with AMX, float32 without); a dtype known to
    fail there is refused before the engine starts."""
    quantization: Quantization | None = None
    """Quantization method of the checkpoint (``awq``/``gptq`` INT4, ``fp8``,
    ``compressed-tensors`` INT8 W8A8, ``bitsandbytes``); ``null`` for none. Whether the
    device supports it is checked before the engine starts."""
    max_model_len: Annotated[int, Field(ge=64, le=1_048_576)] = 2048
    """Longest prompt + completion in tokens."""
    block_size: Annotated[int, Field(ge=16, le=256, multiple_of=16)] = 32
    """Tokens per KV-cache block; also the block size of prefix-cache hints (vLLM on
    the CPU needs a multiple of 32)."""
    enable_prefix_caching: bool = True
    """Reuse KV-cache blocks of shared prompt prefixes (what the router exploits)."""
    enforce_eager: bool = True
    """Skip graph compilation: much faster start-up (about 36 s instead of 120 s for the
    default model on a CPU) at some decode speed."""
    kv_cache_gib: Annotated[float | None, Field(gt=0, le=4096)] = None
    """KV-cache size per replica in GiB; ``null`` keeps the engine's default."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding settings; ``null`` turns it off."""
    replicas: Annotated[int, Field(ge=1, le=1024)] = 1
    """Replicas of this model in each region."""
    resources: ResourcesConfig = ResourcesConfig()
    """Resources reserved per replica."""


class SloConfig(_Section):
    """Service-level objectives; alerts and goodput are measured against them."""

    ttft_p95_ms: Annotated[float, Field(gt=0, le=600_000)] = 500.0
    """Target 95th-percentile time to first token, milliseconds."""
    tpot_p95_ms: Annotated[float, Field(gt=0, le=60_000)] = 100.0
    """Target 95th-percentile time per output token, milliseconds."""


class RouterConfig(_Section):
    """How requests are placed on replicas and regions."""

    policy: PolicyName = "firstlight"
    """Routing policy: ``firstlight`` (predicted TTFT) or a baseline (``round_robin``,
    ``random``, ``least_queue``, ``power_of_two``, ``cache_aware``, ``prefix_affinity``,
    ``weighted_scorer``)."""
    params: Mapping[str, float | int | bool | str] = Field(default_factory=dict)
    """Policy-specific parameters, checked by the policy when the router is built."""
    spill_over_margin_ms: Annotated[float, Field(ge=0, le=60_000)] = 50.0
    """A peer region must beat the local predicted TTFT by this much to take a request."""
    admission_wait_ms: Annotated[float | None, Field(gt=0, le=600_000)] = None
    """Load shedding: the longest queueing wait (predicted, ms) a request may face on
    the best local replica. Beyond it the request goes to a peer region that can take
    it, or is refused at once with 503 and ``Retry-After`` instead of waiting, so the
    admitted requests keep their latency. ``null`` admits everything."""
    peer_timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    """Longest a request forwarded to a peer region waits for the peer's first token
    (forwards always stream, so this is the wait for its first bytes) and for each
    later chunk. Past it the peer counts as failed (its breaker sees it) and the request
    goes to the next peer or is served here. A peer that stops answering its probes is
    given up on at once, without waiting for this bound."""
    slo: SloConfig = SloConfig()
    """Latency objectives."""


class HintsConfig(_Section):
    """Prefix-cache hints shared through Redis."""

    redis_url: Annotated[str, Field(pattern=r"^(redis|rediss|unix)://\S+$")] = (
        "redis://127.0.0.1:6379/0"
    )
    """Redis URL of this region (``rediss://`` for TLS); no password in it."""
    password: SecretRef | None = None
    """Redis password, by reference."""
    ttl_s: Annotated[float, Field(ge=1, le=86_400)] = 600.0
    """Seconds a hint lives without being refreshed."""
    key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9:_.-]{1,64}$")] = "firstlight:"
    """Prefix of every Redis key, so several deployments can share one Redis."""
    hash_seed: Annotated[int, Field(ge=0, le=4_294_967_295)] = 0
    """Seed of prefix block hashes (the engine's ``PYTHONHASHSEED``); engines and
    gateways must agree or no hint will ever match."""


class ApiKeyRef(SecretRef):
    """An API key by reference, and the tenant it belongs to."""

    tenant: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] = None
    """Tenant of the key's callers; keys without one are each their own tenant when
    tenant isolation is on."""


class AuthConfig(_Section):
    """API keys for the OpenAI-compatible endpoints."""

    enabled: bool = False
    """Require a Bearer API key. May be off only in ``local`` mode."""
    api_keys: tuple[ApiKeyRef, ...] = ()
    """Accepted keys, by reference, each optionally with its ``tenant``."""
    tenant_isolation: bool | None = None
    """Salt the prefix cache and its hints per tenant, so no tenant reuses or can
    time-probe another tenant's cached prompts. ``null``: on when any key names a
    tenant."""

    @model_validator(mode="after")
    def _keys_when_enabled(self) -> Self:
        if self.enabled and not self.api_keys:
            raise FieldValueError("api_keys", [], "auth is enabled but no API key is configured")
        return self

    @property
    def isolates_tenants(self) -> bool:
        """Whether requests carry their tenant's cache salt (the gateway reads this)."""
        if self.tenant_isolation is not None:
            return self.tenant_isolation
        return any(key.tenant is not None for key in self.api_keys)


class TelemetryConfig(_Section):
    """Metrics, traces and logs."""

    metrics_enabled: bool = True
    """Expose Prometheus metrics at ``/metrics``."""
    otlp_endpoint: HttpUrl | None = None
    """OTLP endpoint for traces; ``null`` turns trace export off."""
    service_name: Annotated[str, Field(min_length=1, max_length=128)] = "firstlight"
    """OpenTelemetry ``service.name``."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of Firstlight's own loggers."""


class GatewayConfig(_Section):
    """Where the OpenAI-compatible HTTP endpoint listens."""

    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    """Bind address of the HTTP proxy."""
    port: Annotated[int, Field(ge=1, le=65_535)] = 8000
    """HTTP port."""
    max_concurrent_per_key: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Requests one API key (or, with auth off, the whole endpoint) may have in flight
    across all gateways of the region (shared through the hints Redis; each gateway
    alone while Redis is unreachable); more are refused with 429 and ``Retry-After``."""
    max_requests_per_minute_per_key: Annotated[int | None, Field(ge=1, le=100_000_000)] = None
    """Requests one API key may start per minute, across all gateways of the region
    (shared through the hints Redis); more are refused with 429 and ``Retry-After``.
    ``null``: no rate limit."""
    max_in_flight: Annotated[int, Field(ge=1, le=1_000_000)] = 4096
    """Requests one gateway holds at once, all keys together (its queue bound); more
    are refused at once with 503 and ``Retry-After``."""
    first_token_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 300.0
    """A request that has no first token after this long is abandoned with 503."""
    max_body_bytes: Annotated[int, Field(ge=1024, le=1_073_741_824)] = 4_194_304
    """Largest request body in bytes; a larger one gets 413 before it is read whole."""
    max_messages: Annotated[int, Field(ge=1, le=100_000)] = 512
    """Most messages in one chat request (400 beyond)."""
    max_prompt_tokens: Annotated[int | None, Field(ge=1, le=1_048_576)] = None
    """Most prompt tokens per request, after the chat template (400 beyond); ``null``:
    the model's ``max_model_len`` is the only bound."""
    max_output_tokens: Annotated[int | None, Field(ge=1, le=1_048_576)] = None
    """Largest ``max_tokens`` a request may ask for, and the default when it asks for
    none (400 beyond); ``null``: whatever fits the model's context."""
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    """Replica attempts per request, the first included: a replica that fails before
    the first token is retried on another, one that fails mid-stream is resumed on
    another (``stream_migration``); after the last attempt the client gets an error."""
    stream_migration: bool = True
    """Resume a stream whose replica failed mid-way on another replica (the prompt plus
    the tokens already sent), so the client sees one uninterrupted answer. Off: the
    stream ends with an error event."""


def _default_regions() -> tuple[RegionConfig, ...]:
    return (RegionConfig(name="local"),)


def _default_models() -> tuple[ModelConfig, ...]:
    return (ModelConfig(name=DEFAULT_MODEL_NAME),)


class PlatformConfig(_Section):
    """The whole platform's configuration (one per regional deployment)."""

    mode: Literal["local", "kubernetes"] = "local"
    """``local``: every region is a Serve application in one Ray cluster (``make up``);
    ``kubernetes``: this deployment serves ``region`` and reaches peers over HTTPS."""
    region: RegionName | None = None
    """The region this deployment serves; required in ``kubernetes`` mode, ``null`` in
    ``local`` mode to run all regions."""
    regions: Annotated[tuple[RegionConfig, ...], Field(min_length=1)] = Field(
        default_factory=_default_regions
    )
    """All regions and their peers."""
    models: Annotated[tuple[ModelConfig, ...], Field(min_length=1)] = Field(
        default_factory=_default_models
    )
    """Models served in every region."""
    router: RouterConfig = RouterConfig()
    """Routing policy and objectives."""
    hints: HintsConfig = HintsConfig()
    """Prefix-cache hint sharing."""
    auth: AuthConfig = AuthConfig()
    """API key authentication."""
    telemetry: TelemetryConfig = TelemetryConfig()
    """Metrics, traces and logs."""
    gateway: GatewayConfig = GatewayConfig()
    """HTTP endpoint."""
    cache_dir: Path = Field(default_factory=default_cache_dir)
    """Folder for prepared models (``models/``) and other caches."""

    @model_validator(mode="after")
    def _cross_references(self) -> Self:
        names = [r.name for r in self.regions]
        _reject_duplicates("regions", names, "name", "region")
        _reject_duplicates("models", [m.name for m in self.models], "name", "model")
        for i, region in enumerate(self.regions):
            for j, peer in enumerate(region.peers):
                if peer.region not in names:
                    raise FieldValueError(
                        f"regions[{i}].peers[{j}].region",
                        peer.region,
                        f"unknown region; known regions: {', '.join(names)}",
                    )
        if self.region is not None and self.region not in names:
            raise FieldValueError(
                "region", self.region, f"unknown region; known regions: {', '.join(names)}"
            )
        if self.mode == "kubernetes":
            self._check_kubernetes_mode(names)
        return self

    def _check_kubernetes_mode(self, names: list[str]) -> None:
        if self.region is None:
            raise FieldValueError("region", None, "required in kubernetes mode")
        if not self.auth.enabled:
            raise FieldValueError(
                "auth.enabled", False, "authentication may be off only in local mode"
            )
        i = names.index(self.region)
        for j, peer in enumerate(self.regions[i].peers):
            if peer.url is None:
                raise FieldValueError(
                    f"regions[{i}].peers[{j}].url", None, "required in kubernetes mode"
                )

    @property
    def default_model_dir(self) -> Path:
        """Folder ``firstlight prepare-model`` writes the default model to."""
        return self.cache_dir / "models" / DEFAULT_MODEL_NAME

    def model_dir(self, model: ModelConfig) -> Path:
        """Folder the engine loads ``model`` from (the prepared default, or its source)."""
        if model.source == "default":
            return self.default_model_dir
        if model.source == "default-int8":
            return self.default_model_dir.with_name(f"{DEFAULT_MODEL_NAME}-W8A8")
        return Path(model.source).expanduser()


def _reject_duplicates(field: str, values: list[str], attr: str, what: str) -> None:
    seen: set[str] = set()
    for i, value in enumerate(values):
        if value in seen:
            raise FieldValueError(f"{field}[{i}].{attr}", value, f"duplicate {what} name")
        seen.add(value)


# --- loading -------------------------------------------------------------------------


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> PlatformConfig:
    """Load a configuration from a YAML file (or defaults) plus environment overrides.

    Called by the CLI and the app builders. Raises :class:`ConfigError` listing every
    problem: unreadable file, malformed YAML, bad override, invalid field.
    """
    source = str(path) if path is not None else "defaults"
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    return load_config_data(data, source, environ)


def load_config_data(
    data: Mapping[str, Any], source: str, environ: Mapping[str, str] | None = None
) -> PlatformConfig:
    """Like :func:`load_config` for an already-parsed mapping, such as the config a
    RayService passes inline in ``serveConfigV2`` (``build_app``). ``data`` is copied,
    not changed. Raises :class:`ConfigError`."""
    mutable: dict[str, Any] = copy.deepcopy(dict(data))
    overrides = _env_overrides(os.environ if environ is None else environ)
    problems = [_apply_override(mutable, name, value) for name, value in overrides]
    failed = [p for p in problems if p is not None]
    if failed:
        raise ConfigError(failed, source)
    return parse_config(mutable, source)


def parse_config(data: Mapping[str, Any], source: str | None = None) -> PlatformConfig:
    """Validate an already-parsed mapping; raises :class:`ConfigError`."""
    try:
        return PlatformConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc), source) from exc


def validation_problems(exc: ValidationError, prefix: str = "") -> list[ConfigProblem]:
    """Turn pydantic's errors into problems named by field path (under ``prefix``).

    Also used by components that validate their own section later, such as routing
    policies checking ``router.params``.
    """
    errors = exc.errors()
    item_locs = [err["loc"] for err in errors]
    problems = []
    for err in errors:
        # A list whose item failed also reports itself "too short"; that is an echo.
        echo = err["type"] == "too_short" and any(
            loc[: len(err["loc"])] == err["loc"] != loc for loc in item_locs
        )
        if not echo:
            problem = _problem(err)
            if prefix:
                path = f"{prefix}.{problem.path}" if problem.path else prefix
                problem = ConfigProblem(path, problem.message, problem.value, problem.has_value)
            problems.append(problem)
    return problems


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        problem = ConfigProblem("", f"cannot read file: {exc.strerror}")
        raise ConfigError([problem], str(path)) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = getattr(exc, "problem", None) or str(exc)
        problem = ConfigProblem("", f"malformed YAML{where}: {reason}")
        raise ConfigError([problem], str(path)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        problem = ConfigProblem("", f"the document must be a mapping, not {type(data).__name__}")
        raise ConfigError([problem], str(path))
    return data


def _env_overrides(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    return sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIX))


def _apply_override(data: dict[str, Any], name: str, raw: str) -> ConfigProblem | None:
    """Set the field named by environment variable ``name``; return a problem or None."""
    segments = [s.lower() for s in name[len(ENV_PREFIX) :].split("__")]
    if not all(segments):
        return ConfigProblem(name, "empty path segment in environment override")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    node: Any = data
    for depth, segment in enumerate(segments):
        last = depth == len(segments) - 1
        here = ".".join(segments[: depth + 1])
        if isinstance(node, list):
            if not segment.isdigit() or int(segment) >= len(node):
                return ConfigProblem(name, f"{here}: no list item {segment!r} to override")
            if last:
                node[int(segment)] = value
            else:
                node = node[int(segment)]
        elif isinstance(node, dict):
            if last:
                node[segment] = value
            else:
                node = node.setdefault(segment, {})
        else:
            return ConfigProblem(name, f"{here}: cannot override inside a scalar value")
    return None


def _problem(err: Any) -> ConfigProblem:
    path = _format_loc(err["loc"])
    inner = err.get("ctx", {}).get("error")
    if isinstance(inner, FieldValueError):
        full = f"{path}.{inner.path}" if path else inner.path
        return ConfigProblem(full, inner.message, inner.value, True)
    if err["type"] == "missing":
        return ConfigProblem(path, "field required")
    message = str(err["msg"])
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    return ConfigProblem(path, message, err.get("input"), True)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
