"""Ray Serve: the region application (gateway + model deployments) and its request router.

The Ray adapter only: importing this package imports Ray; the region core
(:mod:`firstlight.region`), routing, hints, engines and the HTTP layer do not import it.
"""

from firstlight.serve.app import build_app, deployment_name, region_app

__all__ = ["build_app", "deployment_name", "region_app"]
