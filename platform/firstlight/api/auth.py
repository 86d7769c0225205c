"""API keys: Bearer tokens checked in constant time.

Built once per gateway from ``auth`` (keys resolved from their secret references at
start-up) and called on every request. Keys are kept only as SHA-256 digests, so a
memory dump or a log line never shows one; comparison uses ``hmac.compare_digest``
against every accepted digest, so the time taken says nothing about how close a guess was.
"""

from __future__ import annotations

import hashlib
import hmac

from firstlight.config import AuthConfig
from firstlight.errors import AuthenticationError

__all__ = ["ApiKeys"]


class ApiKeys:
    """The accepted keys of one gateway; ``enabled=False`` accepts everything."""

    def __init__(self, config: AuthConfig) -> None:
        self.enabled = config.enabled
        self._digests = tuple(_digest(ref.resolve()) for ref in config.api_keys)

    def check(self, authorization: str | None) -> str:
        """Return the caller's identity for limits (a digest prefix of its key, or
        ``anonymous`` with auth off); raise :class:`AuthenticationError` unless
        ``authorization`` is ``Bearer <accepted key>``."""
        if not self.enabled:
            return "anonymous"
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
        candidate = _digest(token)
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(candidate, digest)
        if not matched:
            raise AuthenticationError("incorrect API key provided", code="invalid_api_key")
        return candidate.hex()[:16]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()
