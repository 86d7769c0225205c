"""The keys a region's deployments share: the peer key (signed hops between regions,
:mod:`firstlight.regions.hop`) and the port key (the replicas' own ports,
:mod:`firstlight.serve.replica_port`).

The peer key is ``auth.peer_secret`` when configured (every region holds the same one).
Without it — local mode, or a region with no peers — the app builder hands its
deployments a *launcher key*: :data:`LAUNCHER_KEY`, random per process, so the regions
one launcher builds (``make up``) share it and nothing outside that process knows it.
The port key is derived from the peer key and the region, so the gateway and the model
replicas of one region agree without another secret to distribute, and a rebuilt
application keeps it (no port refuses a gateway because the app was redeployed).

Called by :func:`firstlight.serve.app.region_app` (which key to hand over) and by the
``Gateway`` and ``ModelServer`` deployments at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from firstlight.config import PlatformConfig
from firstlight.errors import ConfigError, ConfigProblem
from firstlight.regions.hop import MIN_PEER_KEY_CHARS

__all__ = ["LAUNCHER_KEY", "RegionKeys", "launcher_key", "region_keys"]

LAUNCHER_KEY = secrets.token_hex(32)
"""This process's launcher key (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class RegionKeys:
    peer: str
    """Signs and verifies hops between regions."""
    port: bytes
    """Answers the model replicas' port challenges."""


def launcher_key(config: PlatformConfig) -> str | None:
    """What the app builder hands its deployments: ``None`` when ``auth.peer_secret`` is
    configured (they resolve it themselves), else :data:`LAUNCHER_KEY`."""
    return None if config.auth.peer_secret is not None else LAUNCHER_KEY


def region_keys(config: PlatformConfig, region: str, launcher: str | None) -> RegionKeys:
    """The keys of ``region``'s deployments. Raises :class:`ConfigError` naming
    ``auth.peer_secret`` when it cannot be resolved or is shorter than
    :data:`~firstlight.regions.hop.MIN_PEER_KEY_CHARS`."""
    secret = config.auth.peer_secret
    peer = secret.resolve() if secret is not None else launcher
    if peer is None or len(peer) < MIN_PEER_KEY_CHARS:
        raise ConfigError(
            [
                ConfigProblem(
                    "auth.peer_secret",
                    f"the peer key needs at least {MIN_PEER_KEY_CHARS} characters",
                    "(hidden)",
                    True,
                )
            ]
        )
    port = hmac.new(
        peer.encode("utf-8"), b"firstlight-replica-port/" + region.encode(), hashlib.sha256
    ).digest()
    return RegionKeys(peer, port)
