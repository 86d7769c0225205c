"""Ray Serve: the region application (gateway + model deployments) and its request router.

Importing this package imports Ray; the pure parts (routing, hints, engines, the API
schemas) do not.
"""

from firstlight.serve.app import build_app, deployment_name, region_app
from firstlight.serve.router_state import RouterState, router_state

__all__ = ["RouterState", "build_app", "deployment_name", "region_app", "router_state"]
