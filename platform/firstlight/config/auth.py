"""Who may call the platform: API keys and operator keys by reference, tenants, and the
key regions sign their hops with (:class:`AuthConfig`); secrets are named, never inline
(:class:`SecretRef`). Part of :class:`~firstlight.config.PlatformConfig`; import through
:mod:`firstlight.config`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, model_validator

from firstlight.config._base import FieldValueError, Section
from firstlight.config.model import DynamicContextSettings
from firstlight.errors import ConfigError, ConfigProblem

__all__ = ["ApiKeyRef", "AuthConfig", "SecretRef"]


class SecretRef(Section):
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


class ApiKeyRef(SecretRef):
    """An API key by reference, and the tenant it belongs to."""

    tenant: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] = None
    """Tenant of the key's callers; keys without one are each their own tenant when
    tenant isolation is on."""
    dynamic_context: DynamicContextSettings | None = None
    """Dynamic context loading for this key's chat requests on every chat model, also
    those without ``models[].dynamic_context``; its ``default_budget_tokens``, when set,
    wins over the model's (docs/context.md)."""


class AuthConfig(Section):
    """API keys for the OpenAI-compatible endpoints."""

    enabled: bool = False
    """Require a Bearer API key. May be off only in ``local`` mode."""
    api_keys: tuple[ApiKeyRef, ...] = ()
    """Accepted keys, by reference, each optionally with its ``tenant``."""
    tenant_isolation: bool | None = None
    """Salt the prefix cache and its hints per tenant, so no tenant reuses or can
    time-probe another tenant's cached prompts. ``null``: on when any key names a
    tenant."""
    operator_keys: tuple[SecretRef, ...] = ()
    """Keys that open the operator surfaces, ``/metrics`` and ``/dashboard/api/state``
    (docs/security.md). With ``enabled`` those answer only to one of these — no key is
    401, a client key 403 — and Prometheus scrapes with one (the chart wires it); with
    auth off (local mode only) they stay open like every other path."""
    peer_secret: SecretRef | None = None
    """The key every region of the deployment shares to sign its hops to peers
    (forwards, probes, summaries; at least 16 characters; docs/security.md). A peer's
    request is trusted as one only when its signature verifies, and no client key is
    ever sent to a peer. Required in ``kubernetes`` mode when the region has peers; in
    ``local`` mode, when unset, the launcher makes a random one for its regions."""

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
