"""The HTTP endpoint: Open Inference Protocol v2 routes over the data plane, built in a factory.

Thin handlers: parse, call the data plane, encode — with the codec every target shares
(:mod:`functions.inference_protocol`). Errors map to status codes in one place, the table the cloud
handlers use too (:mod:`functions.http_errors`); a client's mistake is never a 500, and every error,
an unknown route and a wrong method included, answers ``{"error": "..."}``. Optional bearer-token
auth (``FLATPACK_API_TOKEN``) guards everything but the liveness probe; request bodies above
``max_body_mb`` are refused with 413 before they are read whole, and so are gzip / deflate bodies
(``Content-Encoding``) that decode to more.

Every model route is served at ``/v2/models/{name}/...`` and at ``/v2/models/{name}/versions/{version}/...``
(version ``"1"``, the one model metadata lists). Besides the protocol's routes, the read-only Triton
extensions clients call first: ``POST /v2/repository/index``, ``GET /v2/models/{name}/config``,
``GET /v2/models/{name}/stats`` and ``GET /v2/models/stats``; and the classification extension. And
flatpack's own ``GET /v2/models/{name}/traces?last=N``: the last N answered requests' traces (spans per
stage and part, :mod:`functions.trace`), which ``flatpack trace`` draws; with ``OTEL_EXPORTER_OTLP_ENDPOINT``
set they go to that OpenTelemetry collector too (:mod:`serving.api.otel`). And ``GET /v2/models/{name}/slo``: the
deployment's latency SLO and the live figures of its recent requests (:mod:`serving.api.slo`).

Speed (``flatpack bench endpoint``): the guard is plain ASGI (starlette's ``BaseHTTPMiddleware`` costs
a task and two streams per request), and it serves the infer routes itself, with the same handler the
FastAPI route has (which stays, for the OpenAPI document): FastAPI's routing, dependency solving and
exception middleware cost about 0.3 ms of a request's CPU, a third of the endpoint's own; JSON goes
through orjson and pysimdjson (:mod:`functions.json_codec`), uvicorn
parses HTTP with httptools, and a small in-process model runs on the event loop's thread
(:meth:`DataPlane.runs_inline`): handing it to a worker thread and back costs more than it takes.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from functions import json_codec
from functions.content_encoding import decode_body
from functions.errors import FunctionError
from functions.http_errors import (
    ApiError,
    InvalidInput,
    MethodNotAllowed,
    RequestTooLarge,
    RouteNotFound,
    Unauthorized,
    error_body,
    error_response,
)
from functions.inference_protocol import (
    HEADER_LENGTH,
    SERVER_VERSION,
    DecodedRequest,
    check_outputs,
    check_version,
    decode_request,
    encode_response,
    model_config,
    repository_index,
    server_metadata,
)
from functions.inference_stats import statistics_document
from functions.settings import api_token
from functions.trace import RequestTrace, Span
from serving.api.dataplane import DataPlane
from serving.api.otel import OtelExporter

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


def _json(doc: Any, status: int = 200) -> Response:
    return Response(json_codec.dumps(doc), status_code=status, media_type="application/json")


#: the infer routes, plain and versioned, as FastAPI matches ``/v2/models/{name}[/versions/{version}]/infer``
_INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")

#: the infer handler: (model name, version or None, request headers, the body's chunks) -> the response
_InferHandler = Callable[[str, "str | None", Mapping[str, str], AsyncIterable[bytes]], Awaitable[Response]]


class _Guard:
    """Bearer-token check (all but liveness) and the body limit from ``Content-Length``, as plain ASGI; and
    the infer routes, served by ``infer`` without FastAPI's routing (the same handler its route calls)."""

    def __init__(self, app: ASGIApp, *, token: str, limit: int, infer: _InferHandler | None = None) -> None:
        self.app = app
        self.token = token.encode()
        self.limit = limit
        self.infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await _error(refusal)(scope, receive, send)
                return
            match = _INFER_PATH.fullmatch(scope["path"])
            if match is not None and self.infer is not None and scope["method"] == "POST":
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
                try:
                    response = await self.infer(match["name"], match["version"], headers, _chunks(receive))
                except _Disconnected:
                    return  # the client is gone: nobody to answer
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> ApiError | None:
        headers = dict(scope["headers"])
        if self.token and scope["path"] != "/v2/health/live":
            got = headers.get(b"authorization", b"")
            if not (got.startswith(b"Bearer ") and hmac.compare_digest(got[7:], self.token)):
                return Unauthorized.bearer()
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return RequestTooLarge.over(self.limit, int(length))
        return None


class _Disconnected(Exception):
    """The client went away before its request's body arrived."""


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


def create_app(plane: DataPlane, *, token: str | None = None, max_body_mb: float = DEFAULT_MAX_BODY_MB,
               version: str = SERVER_VERSION, exporter: OtelExporter | None = None) -> FastAPI:
    """An app serving ``plane``'s models. ``token``: required bearer token (default: $FLATPACK_API_TOKEN;
    empty: none). ``exporter``: where request traces go besides the data plane's buffer (default: the
    OpenTelemetry collector the environment names, if any)."""
    token = token if token is not None else (api_token() or "")
    limit = int(max_body_mb * 2**20)
    exporter = exporter if exporter is not None else OtelExporter.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        plane.close()
        if exporter is not None:
            exporter.close()

    app = FastAPI(title="flatpack inference endpoint", version=version,
                  description="Open Inference Protocol v2 (KServe/Triton) over models split across serverless "
                              "functions.", lifespan=lifespan)
    app.state.plane = plane
    auth = _responses(_401="missing or wrong bearer token") if token else {}
    unknown = _responses(_404="unknown model or version")
    _add_error_handlers(app)

    async def handle_infer(name: str, version: str | None, headers: Mapping[str, str], chunks: AsyncIterable[bytes]
                           ) -> Response:
        """One infer request, its errors answered by the one table (the route's and the guard's handler)."""
        try:
            info = plane.model(name).info  # 404 before reading a body meant for a model that is not here
            if version is not None:
                check_version(name, version)
            ts, ts_unix = time.perf_counter_ns(), time.time()
            body = decode_body(await _read_limited(chunks, limit), headers.get("content-encoding"), limit)
            t0 = time.perf_counter_ns()
            decoded = decode_request(body, headers.get(HEADER_LENGTH.lower()))
            check_outputs(name, info.outputs, decoded.outputs, decoded.classes)
            t1 = time.perf_counter_ns()
            outputs, spans = await _run(plane, name, decoded, since_ns=t0, origin=ts / 1e9)
            t2 = time.perf_counter_ns()
            payload, out_headers = encode_response(name, decoded, outputs, labels=info.labels)
            t3 = time.perf_counter_ns()
            plane.stats(name).succeeded(t1 - t0, t2 - t1, t3 - t2)
            plane.observe(name, (t3 - t0) / 1e6)  # the SLO's window: the client's latency less the network's share
            trace = RequestTrace(name, 1e3 * ts_unix, (t3 - ts) / 1e6, (
                Span("request", None, None, 0.0, (t3 - ts) / 1e6),
                Span("read_body", None, None, 0.0, (t0 - ts) / 1e6),
                Span("decode", None, None, (t0 - ts) / 1e6, (t1 - ts) / 1e6),
                *spans,
                Span("encode", None, None, (t2 - ts) / 1e6, (t3 - ts) / 1e6)))
            plane.traces(name).add(trace)
            if exporter is not None:
                exporter.export(trace)
        except (ApiError, FunctionError) as e:
            return _error(e)
        return Response(payload, headers=out_headers, media_type=out_headers.pop("content-type"))

    app.add_middleware(_Guard, token=token, limit=limit, infer=handle_infer)

    # the same handler as a route (the guard serves these paths before routing): in the OpenAPI document
    @_model_route(app, "POST", "/infer", tags=["inference"], openapi_extra=_infer_openapi(auth))
    async def infer(name: str, request: Request) -> Response:
        return await handle_infer(name, None, request.headers, request.stream())

    @app.get("/v2/health/live", tags=["health"])
    async def live() -> Response:
        return _json({"live": True})

    @app.get("/v2/health/ready", tags=["health"], responses=_responses(_503="not ready") | auth)
    async def ready() -> Response:
        ok = plane.ready()
        return _json({"ready": ok}, 200 if ok else 503)

    @app.get("/v2", tags=["metadata"], responses=auth)
    async def server() -> Response:
        return _json(server_metadata(version))

    @app.post("/v2/repository/index", tags=["metadata"], responses=_responses(_400="malformed body") | auth,
              openapi_extra={"requestBody": {"required": False, "content": {"application/json": {"schema": {
                  "type": "object", "properties": {"ready": {"type": "boolean"}}}}}}})
    async def index(request: Request) -> Response:
        body = await _read_limited(request, limit)
        return _json(repository_index({n: plane.model(n).ready() for n in plane.names()}, body))

    @app.get("/v2/models/stats", tags=["metadata"], responses=auth)
    async def all_stats() -> Response:
        return _json(statistics_document(plane.stats(n) for n in plane.names()))

    @_model_route(app, "GET", "", tags=["metadata"], responses=unknown | auth)
    async def model_metadata(name: str, request: Request) -> Response:
        return _json(plane.model(name).info.metadata())

    @_model_route(app, "GET", "/ready", tags=["health"], responses=_responses(_503="not ready") | unknown | auth)
    async def model_ready(name: str, request: Request) -> Response:
        ok = plane.model(name).ready()
        return _json({"name": name, "ready": ok}, 200 if ok else 503)

    @_model_route(app, "GET", "/config", tags=["metadata"], responses=unknown | auth)
    async def config(name: str, request: Request) -> Response:
        info = plane.model(name).info
        return _json(model_config(info.name, info.inputs, info.outputs, platform=info.platform))

    @_model_route(app, "GET", "/stats", tags=["metadata"], responses=unknown | auth)
    async def stats(name: str, request: Request) -> Response:
        plane.model(name)
        return _json(statistics_document([plane.stats(name)]))

    @_model_route(app, "GET", "/traces", tags=["metadata"],
                  responses=_responses(_400="bad 'last'") | unknown | auth)
    async def traces(name: str, request: Request) -> Response:
        """The last ``last`` (default 1) answered requests' traces, oldest first: ``{"requests": [{"model",
        "started_unix_ms", "latency_ms", "ok", "breakdown", "spans": [{"name", "stage", "part", "start_ms",
        "end_ms"}]}]}``, times in ms from each request's start."""
        buffer = plane.traces(name)
        raw = request.query_params.get("last", "1")
        if not raw.isdigit() or int(raw) < 1:
            raise InvalidInput(f"'last' must be a whole number of requests, at least 1; got {raw!r}")
        return _json({"requests": [t.to_json() for t in buffer.last(int(raw))]})

    @_model_route(app, "GET", "/slo", tags=["metadata"], responses=unknown | auth)
    async def slo(name: str, request: Request) -> Response:
        """The model's latency SLO and its live figures over the recent window (flatpack's extension):
        ``{"name", "slo": null | {"slo_ms", "percentile", "requests", "mean_ms", "p50_ms", "p95_ms", "p99_ms",
        "statistic_ms", "attainment", "met"}, "window": {"requests", "seconds"}}``, and ``watch`` where
        ``flatpack deploy --watch`` watches it."""
        return _json(plane.slo_document(name))

    @app.get("/metrics", tags=["metrics"], responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
                                                       **auth})
    async def metrics() -> Response:
        return Response(generate_latest(plane.registry), media_type=CONTENT_TYPE_LATEST)

    _add_schema(app)
    return app


async def _run(plane: DataPlane, name: str, request: DecodedRequest, *, since_ns: int, origin: float
               ) -> tuple[dict[str, np.ndarray], list[Span]]:
    """The model's outputs and the spans of computing them (ms from ``origin``, a ``perf_counter`` time):
    on the event loop's thread when the data plane says so, else in a worker thread (the loop serves other
    requests meanwhile). A failure is counted in the model's statistics, as long as it took since
    ``since_ns``."""
    try:
        if plane.runs_inline(name):
            return plane.infer_traced(name, request.inputs, request.outputs, origin=origin)
        return await asyncio.to_thread(plane.infer_traced, name, request.inputs, request.outputs, origin=origin)
    except BaseException:
        plane.stats(name).failed(time.perf_counter_ns() - since_ns)
        raise


_Handler = Callable[[str, Request], Awaitable[Response]]


def _model_route(app: FastAPI, method: str, suffix: str, **kwargs: Any) -> Callable[[_Handler], _Handler]:
    """Serve ``handler`` at ``/v2/models/{name}{suffix}`` and at ``.../versions/{version}{suffix}``, where
    a version other than the model's one is an unknown model (404) — after an unknown model is."""

    def register(handler: _Handler) -> _Handler:
        async def versioned(name: str, version: str, request: Request) -> Response:
            request.app.state.plane.model(name)
            check_version(name, version)
            return await handler(name, request)

        app.add_api_route(f"/v2/models/{{name}}{suffix}", handler, methods=[method], **kwargs)
        app.add_api_route(f"/v2/models/{{name}}/versions/{{version}}{suffix}", versioned, methods=[method],
                          name=f"{handler.__name__}_versioned", **kwargs)
        return handler

    return register


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": ...}`` by the one table (:mod:`functions.http_errors`)."""

    async def known_error(request: Request, exc: Exception) -> Response:
        # the endpoint's errors and the functions' (a throttled, timed-out or failed function), by the one
        # table every target uses (the data plane logged the functions' failures)
        return _error(exc)

    async def no_route(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        if status == 405:
            return _error(MethodNotAllowed.at(request.method, request.url.path))
        if status == 404:
            return _error(RouteNotFound.at(request.method, request.url.path))
        return Response(error_body(str(getattr(exc, "detail", exc))), status_code=status,
                        headers=getattr(exc, "headers", None), media_type="application/json")

    async def invalid(request: Request, exc: Exception) -> Response:
        return _error(InvalidInput(f"bad request: {exc}"))

    app.add_exception_handler(ApiError, known_error)
    app.add_exception_handler(FunctionError, known_error)
    app.add_exception_handler(StarletteHTTPException, no_route)
    app.add_exception_handler(RequestValidationError, invalid)


def _infer_openapi(auth: dict[int | str, dict]) -> dict[str, Any]:
    return {
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
                _400="bad input (malformed, or not what the model takes)", _404="unknown model or version",
                _413="request too large", _415="unsupported Content-Encoding",
                _502="the functions failed to answer (the body names the error)",
                _503="not ready, or at its concurrency limit (then with Retry-After)",
                _504="a function did not answer in time").items()},
            **{str(k): v for k, v in auth.items()},
        },
    }


async def _read_limited(body: Request | AsyncIterable[bytes], limit: int) -> bytes:
    chunks = []
    size = 0
    async for chunk in (body.stream() if isinstance(body, Request) else body):
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
