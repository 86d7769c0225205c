"""The process's router states, by application and deployment: how the gateway finds
the state of the request router Ray built inside its deployment handle.

Ray builds :class:`~firstlight.serve.request_router.FirstlightRequestRouter` from a class
path and JSON keyword arguments, so the gateway cannot hand it an object: the router
registers its :class:`~firstlight.region.state.RouterState` here when it starts
(:func:`routers`), and the gateway reads it (:func:`router_state`). Sharing the process is
the only join Ray leaves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from firstlight.region.state import RouterState

__all__ = ["router_state", "routers"]

_STATES: dict[tuple[str, str], RouterState] = {}


def router_state(app_name: str, deployment_name: str) -> RouterState | None:
    """The state registered by the router of ``deployment_name`` in ``app_name`` in
    this process, or ``None`` before the router exists."""
    return _STATES.get((app_name, deployment_name))


def routers() -> dict[tuple[str, str], RouterState]:
    """Every router state of this process (called by the router when it starts)."""
    return _STATES
