"""The serving benchmark's floor: a bare Ray Serve app of the platform's shape.

An ingress deployment relays a 2-replica deployment's streamed items as SSE, without
FastAPI or any of Firstlight's per-request work: what Ray Serve alone costs on the same
path. Deployed by :func:`firstlight_bench.tools.serving.serving` beside the platform's region.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["FLOOR_APP", "deploy_floor"]

FLOOR_APP = "bench-ray-floor"


class _FloorEcho:
    """A bare deployment that streams ``n`` items back (``ModelServer``'s shape)."""

    async def generate(self, prompt: list[int], n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


class _FloorIngress:
    """A bare ingress relaying :class:`_FloorEcho`'s items as SSE (the gateway's shape,
    without FastAPI or any of Firstlight's per-request work)."""

    def __init__(self, echo: Any) -> None:
        self._echo = echo

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        body = json.loads(await request.body())
        items = self._echo.options(stream=True).generate.remote(
            body["prompt"], body["max_tokens"] + 1
        )

        async def events() -> AsyncIterator[bytes]:
            async for i in items:
                if i:  # the first item stands for ServedBy
                    yield f"data: {i}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def deploy_floor() -> None:
    """Deploy the floor app in the running Ray cluster at ``/{FLOOR_APP}``."""
    from ray import serve

    deployment: Any = serve.deployment
    echo = deployment(_FloorEcho).options(
        num_replicas=2, max_ongoing_requests=256, ray_actor_options={"num_cpus": 0}
    )
    ingress = deployment(_FloorIngress).options(
        max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0}
    )
    serve.run(ingress.bind(echo.bind()), name=FLOOR_APP, route_prefix=f"/{FLOOR_APP}")
