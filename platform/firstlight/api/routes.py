"""The gateway's HTTP routes: the OpenAI-compatible API, health, peers' summary, and
for operators ``/metrics`` and the dashboard.

Built once per gateway replica by the ingress deployment
(:class:`firstlight.serve.gateway_deployment.Gateway`) over its
:class:`~firstlight.api.gateway.GatewayCore`. The handlers read raw bodies (so bad
JSON gets OpenAI's error shape, not FastAPI's), so the OpenAPI document at
``/openapi.json`` is given the request schemas explicitly: clients and the fuzz tests
(schemathesis) see what the gateway validates.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from firstlight.api.gateway import GatewayCore
from firstlight.api.responses import error_response
from firstlight.api.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingsRequest
from firstlight.dashboard import page
from firstlight.errors import ApiError
from firstlight.regions.peers import SUMMARY_PATH

__all__ = ["build_fastapi"]


def build_fastapi(core: GatewayCore) -> FastAPI:
    """The gateway's HTTP routes over ``core`` (called by the ingress deployment)."""
    app = FastAPI(title=f"Firstlight gateway ({core.region})", docs_url=None, redoc_url=None)

    @app.post("/v1/chat/completions", openapi_extra=_json_body(ChatCompletionRequest))
    async def chat(request: Request) -> Response:
        return await core.completions("chat", request)

    @app.post("/v1/completions", openapi_extra=_json_body(CompletionRequest))
    async def completions(request: Request) -> Response:
        return await core.completions("text", request)

    @app.post("/v1/embeddings", openapi_extra=_json_body(EmbeddingsRequest))
    async def embeddings(request: Request) -> Response:
        return await core.completions("embeddings", request)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return core.models(request)

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> Response:
        return core.model(request, model_id)

    @app.get("/healthz")
    async def healthz() -> Response:
        return JSONResponse({"status": "ok", "region": core.region})

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        # Probes need only the status; the detail (replicas, hint feed) is the region's
        # topology, for operators.
        ready, detail = core.readiness()
        if not core.keys.is_operator(request.headers.get("authorization")):
            detail = {"region": core.region}
        return JSONResponse({"ready": ready, **detail}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        try:
            core.keys.check_operator(request.headers.get("authorization"))
        except ApiError as exc:
            return error_response(exc)
        if not core.telemetry.enabled:
            return JSONResponse({"detail": "metrics are off (telemetry.metrics_enabled)"}, 404)
        body = await core.metrics_exposition()
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/dashboard")
    async def dashboard() -> Response:
        return HTMLResponse(page(), headers={"cache-control": "no-store"})

    @app.get("/dashboard/api/state")
    async def dashboard_api(request: Request) -> Response:
        # The page itself holds no data; its state lists every tenant's rows.
        try:
            core.keys.check_operator(request.headers.get("authorization"))
        except ApiError as exc:
            return error_response(exc)
        return JSONResponse(await core.dashboard_state(), headers={"cache-control": "no-store"})

    @app.get(SUMMARY_PATH)
    async def summary(request: Request) -> Response:
        # A peer's probe is a signed hop; an operator may read it with a client key.
        if core.peers.signer.verify(SUMMARY_PATH, request.headers) is None:
            try:
                core.keys.check(request.headers.get("authorization"))
            except ApiError as exc:
                return error_response(exc)
        return JSONResponse(core.summary().to_json())

    @app.get("/v1/firstlight/advisor")
    async def advisor(request: Request) -> Response:
        try:
            caller = core.keys.check(request.headers.get("authorization"))
        except ApiError as exc:
            return error_response(exc)
        return JSONResponse(core.advice(caller), headers={"cache-control": "no-store"})

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version="1", routes=app.routes)
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for model in (ChatCompletionRequest, CompletionRequest):
                schema = model.model_json_schema(ref_template=_REF)
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


_REF = "#/components/schemas/{model}"


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """An operation's JSON request body, referring to ``model``'s schema component."""
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
