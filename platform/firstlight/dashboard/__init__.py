"""The built-in operator dashboard: a static page served by every gateway at
``/dashboard`` and its data at ``/dashboard/api/state``."""

from firstlight.dashboard.state import dashboard_state, page

__all__ = ["dashboard_state", "page"]
