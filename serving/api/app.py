"""The HTTP endpoint: Open Inference Protocol v2 routes over the data plane, built in a factory.

Thin handlers: parse, call the data plane, encode — with the codec every target shares
(:mod:`functions.inference_protocol`). Errors map to status codes in one place, the table the cloud
handlers use too (:mod:`functions.http_errors`); a client's mistake is never a 500. Optional bearer-token
auth (``FLATPACK_API_TOKEN``) guards everything but the liveness probe; request bodies above
``max_body_mb`` are refused with 413 before they are read whole.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.base import RequestResponseEndpoint

from functions.errors import FunctionError
from functions.http_errors import (
    ApiError,
    MethodNotAllowed,
    RequestTooLarge,
    RouteNotFound,
    Unauthorized,
    error_response,
)
from functions.inference_protocol import (
    HEADER_LENGTH,
    SERVER_VERSION,
    decode_request,
    encode_response,
    server_metadata,
)
from functions.settings import api_token
from serving.api.dataplane import DataPlane

__all__ = ["DEFAULT_MAX_BODY_MB", "create_app"]

DEFAULT_MAX_BODY_MB = 64.0

_ERROR_BODY = {"application/json": {"schema": {"type": "object", "required": ["error"],
                                                "properties": {"error": {"type": "string"}}}}}


def _responses(**codes: str) -> dict[int | str, dict]:
    """OpenAPI ``responses`` for error statuses (``_404="unknown model"``), each with the ``{"error"}`` body."""
    return {int(k.lstrip("_")): {"description": v, "content": _ERROR_BODY} for k, v in codes.items()}


def _error(exc: BaseException) -> Response:
    err = error_response(exc)
    return Response(err.body, status_code=err.status, headers=dict(err.headers))


def create_app(plane: DataPlane, *, token: str | None = None, max_body_mb: float = DEFAULT_MAX_BODY_MB,
               version: str = SERVER_VERSION) -> FastAPI:
    """An app serving ``plane``'s models. ``token``: required bearer token (default: $FLATPACK_API_TOKEN;
    empty: none)."""
    token = token if token is not None else api_token()
    limit = int(max_body_mb * 2**20)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        plane.close()

    app = FastAPI(title="flatpack inference endpoint", version=version,
                  description="Open Inference Protocol v2 (KServe/Triton) over models split across serverless "
                              "functions.", lifespan=lifespan)
    app.state.plane = plane
    auth = _responses(_401="missing or wrong bearer token") if token else {}

    async def known_error(request: Request, exc: Exception) -> Response:
        # the endpoint's errors and the functions' (a throttled, timed-out or failed function), by the one
        # table every target uses (the data plane logged the functions' failures)
        return _error(exc)

    app.add_exception_handler(ApiError, known_error)
    app.add_exception_handler(FunctionError, known_error)

    @app.exception_handler(StarletteHTTPException)
    async def no_route(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return _error(MethodNotAllowed.at(request.method, request.url.path))
        if exc.status_code == 404:
            return _error(RouteNotFound.at(request.method, request.url.path))
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.middleware("http")
    async def guard(request: Request, call_next: RequestResponseEndpoint) -> Response:
        if token and request.url.path not in ("/v2/health/live",):
            got = request.headers.get("authorization", "")
            if not (got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), token.encode())):
                return _error(Unauthorized.bearer())
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return _error(RequestTooLarge.over(limit, int(length)))
        return await call_next(request)

    @app.get("/v2/health/live", tags=["health"])
    async def live() -> dict:
        return {"live": True}

    @app.get("/v2/health/ready", tags=["health"], responses=_responses(_503="not ready") | auth)
    async def ready() -> JSONResponse:
        ok = plane.ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2", tags=["metadata"], responses=auth)
    async def server() -> dict:
        return server_metadata(version)

    @app.get("/v2/models/{name}", tags=["metadata"], responses=_responses(_404="unknown model") | auth)
    async def model_metadata(name: str) -> dict:
        return plane.model(name).info.metadata()

    @app.get("/v2/models/{name}/ready", tags=["health"],
             responses=_responses(_404="unknown model", _503="not ready") | auth)
    async def model_ready(name: str) -> JSONResponse:
        ok = plane.model(name).ready()
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    @app.post(
        "/v2/models/{name}/infer",
        tags=["inference"],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"},
                                                 "description": f"JSON header ({HEADER_LENGTH} bytes) "
                                                                "followed by raw tensor bytes"},
                },
            },
            "responses": {
                "200": {"description": "the outputs", "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                **{str(k): v for k, v in _responses(
                    _400="bad input (malformed, or not what the model takes)", _404="unknown model",
                    _413="request too large", _502="the functions failed to answer (the body names the error)",
                    _503="not ready, or at its concurrency limit (then with Retry-After)",
                    _504="a function did not answer in time").items()},
                **{str(k): v for k, v in auth.items()},
            },
        },
    )
    async def infer(name: str, request: Request) -> Response:
        plane.model(name)  # 404 before reading a body meant for a model that is not here
        body = await _read_limited(request, limit)
        decoded = decode_request(body, request.headers.get(HEADER_LENGTH))
        outputs = await asyncio.to_thread(plane.infer, name, decoded.inputs, decoded.outputs)
        payload, headers = encode_response(name, decoded, outputs)
        return Response(payload, headers=headers, media_type=headers.pop("content-type"))

    @app.get("/metrics", tags=["metrics"], responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
                                                       **auth})
    async def metrics() -> Response:
        return Response(generate_latest(plane.registry), media_type=CONTENT_TYPE_LATEST)

    _add_schema(app)
    return app


async def _read_limited(request: Request, limit: int) -> bytes:
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge.over(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _add_schema(app: FastAPI) -> None:
    """Put the InferRequest schema into the OpenAPI document the infer route refers to."""
    from serving.api.schema import InferRequest

    original = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        model_schema = InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(model_schema.pop("$defs", {}))
        comps["InferRequest"] = model_schema
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend its schema
