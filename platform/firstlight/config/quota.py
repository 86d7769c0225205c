"""The token quota's section (:class:`TokenQuotaConfig`): how the gateway reserves and
shares ``gateway.max_tokens_per_minute_per_key``. Part of
:class:`~firstlight.config.GatewayConfig` (``gateway.token_quota``); import through
:mod:`firstlight.config`. Read by :class:`firstlight.api.token_quota.TokenQuota` and the
Ray gateway deployment, which builds its Redis client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from firstlight.config._base import FieldValueError, Section
from firstlight.config.auth import SecretRef

__all__ = ["TokenQuotaConfig"]


class TokenQuotaConfig(Section):
    """How the per-key token quota is reserved, shared and enforced while its Redis is
    unreachable (docs/reliability.md, "Token quota")."""

    reserve_output_tokens: Annotated[int | None, Field(ge=1, le=1_048_576)] = 1024
    """Output tokens a request reserves at admission, at most (its prompt is always
    reserved whole); what it uses beyond is charged when it ends, so the quota may be
    exceeded by one request's overrun. Bounded by default because a request that sets no
    ``max_tokens`` may be given the whole context, and reserving that would refuse every
    such request on a quota smaller than the model's context. ``null``: the request's
    whole ``max_tokens`` (or all it may be given), so the quota is never exceeded."""
    scope: Literal["region", "global"] = "region"
    """Who shares the quota: ``region``, every gateway of the region through the hints
    Redis (as the request limits); ``global``, every gateway of every region through the
    Redis at ``redis_url``, which all regions must reach."""
    redis_url: Annotated[str | None, Field(pattern=r"^(redis|rediss|unix)://\S+$")] = None
    """The Redis every region shares the quota through (``scope: global`` only, and
    required there); no password in it."""
    password: SecretRef | None = None
    """Password of ``redis_url``, by reference."""
    tls_ca_file: Path | None = None
    """PEM file of the certificate authority of ``redis_url``'s server (``rediss://``
    only); unset: the system's trust store."""
    lease_tokens: Annotated[int | None, Field(ge=1, le=1_000_000_000_000)] = None
    """Tokens a gateway takes from the shared counter at a time; it admits requests from
    what it holds without asking Redis, and gives back what it holds beyond one lease.
    Larger: fewer Redis calls; smaller: less of the quota idle in one gateway while
    another refuses. ``null``: a twentieth of the quota."""
    deadline_ms: Annotated[float, Field(ge=1, le=10_000)] = 50.0
    """How long a lease from the shared Redis may take before the Redis counts as
    unreachable (for ``scope: global``, more than the round trip to it). Only a request
    that finds its gateway's leased tokens spent waits for it."""
    when_unreachable: Literal["local", "open", "closed"] = "local"
    """While the shared Redis is unreachable: ``local``, each gateway enforces the whole
    quota alone (N gateways admit up to N times it; the request limits do the same);
    ``open``, no token quota at all; ``closed``, only what the gateway already holds is
    admitted, beyond that 503 with ``Retry-After``. Tokens already leased are used first
    in every case."""

    @model_validator(mode="after")
    def _redis_only_for_global(self) -> Self:
        if self.scope == "global" and self.redis_url is None:
            raise FieldValueError(
                "redis_url", None, "scope 'global' needs the Redis all regions reach"
            )
        if self.scope == "region":
            for name in ("redis_url", "password", "tls_ca_file"):
                value = getattr(self, name)
                if value is not None:
                    raise FieldValueError(
                        name,
                        "<set>" if name == "password" else str(value),
                        "only with scope 'global' (scope 'region' uses the hints Redis)",
                    )
        if self.tls_ca_file is not None and not str(self.redis_url).startswith("rediss://"):
            raise FieldValueError(
                "tls_ca_file", str(self.tls_ca_file), "a CA file needs a rediss:// redis_url"
            )
        return self
