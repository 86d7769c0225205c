"""API keys: Bearer tokens checked in constant time, and the tenant each belongs to.

Built once per gateway from ``auth`` (keys resolved from their secret references at
start-up) and called on every request. Keys are kept only as SHA-256 digests, so a
memory dump or a log line never shows one; comparison uses ``hmac.compare_digest``
against every accepted digest, so the time taken says nothing about how close a guess was.
Operator keys (``auth.operator_keys``) open the operator surfaces, which client keys do
not (:meth:`ApiKeys.check_operator`).

With tenant isolation (``auth.tenant_isolation``, on when keys name tenants) every
request carries a **cache salt** derived from its tenant: the engines mix it into the
first prefix block's hash, and the gateway into its hint hashes, so one tenant's
prompts never hit, and cannot be timed against, another tenant's cache. The salt is an
HMAC of the tenant name (never the key) keyed by ``salt_key``, which the gateway derives
from the regions' shared peer key: the same in every gateway and region of one
deployment, and not computable by anyone who knows only tenant names.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from firstlight.config import AuthConfig, DynamicContextSettings
from firstlight.errors import AuthenticationError, PermissionDeniedError

__all__ = ["SALT_KEY_PURPOSE", "ApiKeys", "Caller"]

SALT_KEY_PURPOSE = b"firstlight-tenant-salt"
"""What the gateway derives the cache salts' key for from the peer key."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: ``identity`` for per-key limits (a digest prefix of the key,
    or ``anonymous``), and the prefix-cache salt of its tenant (``None``: shared)."""

    identity: str
    cache_salt: str | None = None
    tenant: str | None = None
    """The tenant its key names, if any."""
    dynamic_context: DynamicContextSettings | None = None
    """Its key's opt-in to dynamic context loading (``auth.api_keys[].dynamic_context``),
    read by :class:`~firstlight.api.context.ContextLoader`."""

    @property
    def group(self) -> str:
        """How the prefix-cache advisor groups this caller's requests: its tenant, else
        its key's identity."""
        return self.tenant or self.identity


class ApiKeys:
    """The accepted keys of one gateway; ``enabled=False`` accepts everything.
    ``salt_key`` keys the tenants' cache salts (:meth:`HopSigner.derived_key
    <firstlight.regions.hop.HopSigner.derived_key>` of :data:`SALT_KEY_PURPOSE`)."""

    def __init__(self, config: AuthConfig, *, salt_key: bytes) -> None:
        self.enabled = config.enabled
        isolate = config.isolates_tenants
        self._keys: tuple[tuple[bytes, Caller], ...] = tuple(
            (
                digest,
                Caller(
                    digest.hex()[:16],
                    _salt(salt_key, ref.tenant or digest.hex()) if isolate else None,
                    ref.tenant,
                    ref.dynamic_context,
                ),
            )
            for ref in config.api_keys
            for digest in (_digest(ref.resolve()),)
        )
        self._operators = tuple(_digest(ref.resolve()) for ref in config.operator_keys)

    def check(self, authorization: str | None) -> Caller:
        """Return the caller; raise :class:`AuthenticationError` unless
        ``authorization`` is ``Bearer <accepted key>``."""
        if not self.enabled:
            return Caller("anonymous")
        candidate = _bearer(authorization)
        found: Caller | None = None
        for digest, caller in self._keys:  # every key compared: constant time
            if hmac.compare_digest(candidate, digest):
                found = caller
        if found is None:
            raise AuthenticationError("incorrect API key provided", code="invalid_api_key")
        return found

    def is_operator(self, authorization: str | None) -> bool:
        """Whether ``authorization`` carries an operator key (always, with auth off);
        never raises. Called per request for what only operators see: the route's
        replica and decision headers, ``/readyz``'s detail."""
        if not self.enabled:
            return True
        try:
            candidate = _bearer(authorization)
        except AuthenticationError:
            return False
        operator = False
        for digest in self._operators:  # every key compared: constant time
            operator |= hmac.compare_digest(candidate, digest)
        return operator

    def check_operator(self, authorization: str | None) -> None:
        """Pass when auth is off or ``authorization`` carries an operator key
        (``auth.operator_keys``); raise :class:`AuthenticationError` for no key or an
        unknown one, :class:`PermissionDeniedError` for a client's key. Called by the
        operator routes (``/metrics``, the dashboard's state)."""
        if not self.enabled:
            return
        candidate = _bearer(authorization)
        operator = client = False
        for digest in self._operators:  # every key compared: constant time
            operator |= hmac.compare_digest(candidate, digest)
        for digest, _ in self._keys:
            client |= hmac.compare_digest(candidate, digest)
        if operator:
            return
        if client:
            raise PermissionDeniedError(
                "a client key does not open the operator surfaces: use an operator key "
                "(auth.operator_keys)",
                code="operator_key_required",
            )
        raise AuthenticationError("incorrect operator key provided", code="invalid_api_key")


def _bearer(authorization: str | None) -> bytes:
    """The digest of the Bearer token in ``authorization``; raises
    :class:`AuthenticationError` when there is none."""
    if not authorization:
        raise AuthenticationError(
            "missing API key: send it as 'Authorization: Bearer <key>'",
            code="invalid_api_key",
        )
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError(
            "malformed Authorization header: expected 'Bearer <key>'",
            code="invalid_api_key",
        )
    return _digest(token)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def _salt(key: bytes, tenant: str) -> str:
    message = b"firstlight-tenant/" + tenant.encode("utf-8")
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:32]
