"""Signed hops: how a peer region's gateway proves that a request is its own.

A gateway that forwards a request, probes a peer or reads its summary signs the request
with the regions' shared peer key (``auth.peer_secret``; in local mode a key the
launcher makes for the cluster). The receiving gateway gives *peer treatment* —
authentication by the signature instead of a client key, the caller's identity and
cache salt taken from the claim, the hop honoured (no second forward), a continuation's
token ids and the forwarder's request id adopted — only to a request whose signature it
verifies. Anything else is an ordinary client request, whatever its headers say.

What is signed (HMAC-SHA256, :meth:`HopSigner._mac`): a version tag, the sending region,
the target (the API path below any mount prefix, as
:func:`~firstlight.api.forward.api_path` gives it), the request id, the time, a random
nonce, the caller claim and the SHA-256 of the body. The receiver accepts a signature
when it matches, its time is within :data:`REPLAY_WINDOW_S` of its own clock, and its
nonce has not been seen within that window (a replay is refused even inside the
window).

Pure: no I/O; the clock is injected. Built once per gateway by the Ray adapter
(:func:`firstlight.serve.gateway_deployment.peer_table`), used by
:class:`~firstlight.api.forward.PeerForwarder` and :class:`~firstlight.regions.peers.PeerTable`
to sign, and by :class:`~firstlight.api.gateway.GatewayCore` and the summary route to
verify.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "CALLER_HEADER",
    "HOP_HEADER",
    "MIN_PEER_KEY_CHARS",
    "REPLAY_WINDOW_S",
    "REQUEST_ID_HEADER",
    "SIGNATURE_HEADER",
    "CallerClaim",
    "HopSigner",
    "PeerHop",
]

HOP_HEADER = "x-firstlight-hop"
"""The sending region's name: this request was forwarded by a peer (never forwarded again)."""
SIGNATURE_HEADER = "x-firstlight-hop-signature"
"""``t=<unix seconds>,n=<nonce hex>,s=<HMAC-SHA256 hex>`` (:meth:`HopSigner.sign`)."""
CALLER_HEADER = "x-firstlight-caller"
"""The caller the sending region authenticated: ``<identity>;<cache salt>;<tenant>``
(``-`` for none), so the receiver applies the same per-key limits and prefix-cache salt
without holding the client's key."""
REQUEST_ID_HEADER = "x-firstlight-request-id"
"""The forwarding gateway's request id, adopted by the peer (signed with the hop)."""

MIN_PEER_KEY_CHARS = 16
"""The shortest peer key accepted (``openssl rand -hex 32`` gives 64)."""

REPLAY_WINDOW_S = 30.0
"""How far a signature's time may be from the receiver's clock, either way; nonces are
remembered this long. Regions' clocks must agree within it (NTP does far better)."""

_MAX_NONCES = 200_000
"""Nonces remembered at most (bounded memory under a flood of valid signatures)."""
_VERSION = b"firstlight-hop-v1"
_FIELD = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_SIGNATURE = re.compile(r"t=(\d{1,12}),n=([0-9a-f]{32}),s=([0-9a-f]{64})")


@dataclass(frozen=True, slots=True)
class CallerClaim:
    """Who the sending region authenticated (see :data:`CALLER_HEADER`)."""

    identity: str
    cache_salt: str | None = None
    tenant: str | None = None

    def header(self) -> str:
        return ";".join((self.identity, self.cache_salt or "-", self.tenant or "-"))

    @classmethod
    def parse(cls, value: str) -> CallerClaim | None:
        parts = value.split(";")
        if len(parts) != 3 or not all(_FIELD.fullmatch(p) for p in parts):
            return None
        identity, salt, tenant = parts
        return cls(identity, None if salt == "-" else salt, None if tenant == "-" else tenant)


@dataclass(frozen=True, slots=True)
class PeerHop:
    """A verified hop: the sending region, and what it vouched for."""

    region: str
    request_id: str | None
    caller: CallerClaim | None


class HopSigner:
    """Signs this region's requests to peers and verifies theirs (one per gateway)."""

    def __init__(
        self,
        key: str,
        region: str,
        *,
        clock: Callable[[], float] = time.time,
        window_s: float = REPLAY_WINDOW_S,
    ) -> None:
        if len(key) < MIN_PEER_KEY_CHARS:
            raise ValueError(f"a peer key needs at least {MIN_PEER_KEY_CHARS} characters")
        self._key = hashlib.sha256(b"firstlight-peer-key/" + key.encode("utf-8")).digest()
        self.region = region
        self._clock = clock
        self._window_s = window_s
        self._seen: OrderedDict[str, float] = OrderedDict()

    def derived_key(self, purpose: bytes) -> bytes:
        """A key for ``purpose`` derived from the peer key (HMAC-SHA256): the same in
        every region that shares the peer key, useless for signing hops. The gateway
        keys its tenants' cache salts with one."""
        return hmac.new(self._key, b"firstlight-derived/" + purpose, hashlib.sha256).digest()

    def sign(
        self,
        target: str,
        body: bytes = b"",
        *,
        request_id: str | None = None,
        caller: CallerClaim | None = None,
    ) -> dict[str, str]:
        """The headers that make a request to a peer a signed hop from this region."""
        t = str(int(self._clock()))
        nonce = secrets.token_hex(16)
        claim = caller.header() if caller is not None else ""
        mac = self._mac(self.region, target, request_id or "", t, nonce, claim, body)
        headers = {HOP_HEADER: self.region, SIGNATURE_HEADER: f"t={t},n={nonce},s={mac}"}
        if request_id is not None:
            headers[REQUEST_ID_HEADER] = request_id
        if caller is not None:
            headers[CALLER_HEADER] = claim
        return headers

    def verify(self, target: str, headers: Mapping[str, str], body: bytes = b"") -> PeerHop | None:
        """The hop, when ``headers`` carry a valid, fresh, unreplayed signature over
        this request; else ``None`` (an ordinary client request). Never raises."""
        region = headers.get(HOP_HEADER)
        signature = headers.get(SIGNATURE_HEADER)
        if region is None or signature is None or not _FIELD.fullmatch(region):
            return None
        match = _SIGNATURE.fullmatch(signature)
        if match is None:
            return None
        t, nonce, mac = match.groups()
        now = self._clock()
        if abs(now - int(t)) > self._window_s:
            return None
        request_id = headers.get(REQUEST_ID_HEADER)
        if request_id is not None and not _FIELD.fullmatch(request_id):
            return None
        claim = headers.get(CALLER_HEADER, "")
        caller = CallerClaim.parse(claim) if claim else None
        if claim and caller is None:
            return None
        expected = self._mac(region, target, request_id or "", t, nonce, claim, body)
        if not hmac.compare_digest(expected, mac):
            return None
        if not self._fresh(nonce, now):
            return None
        return PeerHop(region, request_id, caller)

    def _fresh(self, nonce: str, now: float) -> bool:
        """Remember ``nonce``; ``False`` when it was seen within the window (a replay)."""
        seen = self._seen
        while seen:
            oldest, at = next(iter(seen.items()))
            if now - at <= 2 * self._window_s and len(seen) < _MAX_NONCES:
                break
            del seen[oldest]
        if nonce in seen:
            return False
        seen[nonce] = now
        return True

    def _mac(
        self,
        region: str,
        target: str,
        request_id: str,
        t: str,
        nonce: str,
        claim: str,
        body: bytes,
    ) -> str:
        message = b"\n".join(
            (
                _VERSION,
                region.encode(),
                target.encode(),
                request_id.encode(),
                t.encode(),
                nonce.encode(),
                claim.encode(),
                hashlib.sha256(body).hexdigest().encode(),
            )
        )
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
