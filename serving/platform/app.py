"""HTTP routes of the local platform (thin; the work is in :class:`PlatformService`).

* ``POST /2015-03-31/functions/{name}/invocations`` — AWS Lambda's Invoke REST shape, so boto3's Lambda
  client (``endpoint_url`` pointed here) and the Lambda invoker work against it unchanged.
* ``POST /function/{name}`` — the OpenFaaS gateway's shape.
* ``PUT|DELETE|GET /flatpack/functions[/{name}]`` — register, remove, list functions and their instances.
* ``PUT /flatpack/bundles`` — take in a bundle (``{"source": dir}``) before functions are registered on it.
* ``GET /flatpack/meter`` (JSON) and ``GET /metrics`` (Prometheus text) — the billing meter.
* ``GET /healthz`` — the only route that needs no token (see :mod:`serving.platform.auth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request, Response

from platforms import PlatformProfile
from serving.platform.auth import PlatformCredentials, PlatformHome, TokenMiddleware
from serving.platform.config import PlatformConfig
from serving.platform.errors import FunctionFailed, PlatformError, RequestTooLarge
from serving.platform.service import PlatformService
from serving.platform.spec import FunctionSpec, check_name

__all__ = ["InvokeFastPath", "create_app", "fast_invocations"]

log = logging.getLogger(__name__)

_JSON = "application/json"


def _json(doc: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(doc), status_code=status, media_type=_JSON, headers=headers)


def _lambda_platform_error(e: PlatformError) -> Response:
    return _json({"Type": "User" if e.status < 500 else "Service", "message": e.message}, e.status,
                 {"x-amzn-ErrorType": e.error_type})


def _bad_request(message: str) -> Response:
    return _json({"error": {"type": "InvalidParameterValueException", "message": message}}, 400)


async def _lambda_reply(service: PlatformService, name: str, payload: bytes) -> Response:
    """A RequestResponse invocation's answer in Lambda's shape."""
    try:
        reply = await service.invoke(name, payload)
    except PlatformError as e:
        return _lambda_platform_error(e)
    except FunctionFailed as e:
        return _json({"errorType": e.lambda_type, "errorMessage": e.message}, 200,
                     {"X-Amz-Function-Error": "Unhandled", "X-Amz-Executed-Version": "$LATEST"})
    return Response(reply.body, media_type="application/octet-stream", headers={"X-Amz-Executed-Version": "$LATEST"})


class InvokeFastPath:
    """The platform's hot path in plain ASGI: ``POST /2015-03-31/functions/{name}/invocations`` of the
    RequestResponse kind (every invocation a master sends), answered before FastAPI's routing and middleware
    stack; every other request goes to ``app``.

    The platform is part of the host, not of any function: its CPU is not any function's share, and what it
    spends per invocation delays the next one (a split stage's parts are invoked at once, and the last is
    forwarded only after the platform has handled the others). FastAPI's stack spent twice what the
    invocation itself does. The path checks the token as :class:`TokenMiddleware` does (the same refusal,
    the same log line) and reads at most the profile's payload limit (past it: Lambda's
    RequestTooLargeException, without reading the rest)."""

    _PREFIX = "/2015-03-31/functions/"
    _SUFFIX = "/invocations"

    def __init__(self, app: FastAPI, service: PlatformService, guard: TokenMiddleware) -> None:
        self.app = app
        self.service = service
        self.guard = guard

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        name = self._invocation(scope)
        if name is None:
            await self.app(scope, receive, send)
            return
        refusal = self.guard.refusal(scope)
        if refusal is not None:
            await refusal(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            more = bool(message.get("more_body", False))
            try:
                self.service.check_request_size(size, more=more)
            except RequestTooLarge as e:
                await _lambda_platform_error(e)(scope, receive, send)
                return
            chunks.append(chunk)
        await (await _lambda_reply(self.service, name, b"".join(chunks)))(scope, receive, send)

    def _invocation(self, scope: Any) -> str | None:
        """The function a RequestResponse Lambda invocation names (None: any other request)."""
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return None
        path: str = scope.get("path", "")
        if not (path.startswith(self._PREFIX) and path.endswith(self._SUFFIX)):
            return None
        name = path[len(self._PREFIX):-len(self._SUFFIX)]
        if not name or "/" in name:
            return None
        for k, v in scope.get("headers") or ():
            if k == b"x-amz-invocation-type" and v.decode("latin-1") != "RequestResponse":
                return None
        return name


def fast_invocations(app: FastAPI) -> InvokeFastPath:
    """``app`` (from :func:`create_app`) behind its invocations' fast path (:class:`InvokeFastPath`)."""
    return InvokeFastPath(app, app.state.service, app.state.guard)


def create_app(config: PlatformConfig, profile: PlatformProfile | None = None, *,
               credentials: PlatformCredentials | None = None, home: PlatformHome | None = None) -> FastAPI:
    """A new app with its own :class:`PlatformService` on ``app.state.service``, answering only requests
    that carry ``credentials``' token (a new random one if not given; see :mod:`serving.platform.auth`).
    ``home``: the platform's state directory (its token file, its bundles)."""
    credentials = credentials or PlatformCredentials()
    service = PlatformService(config, profile, credentials=credentials, home=home)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()
            # here rather than after the server returns: uvicorn re-raises the SIGTERM it caught once it
            # has shut down, which ends the process before any code after it runs
            if home is not None:
                home.remove(credentials)

    app = FastAPI(title="flatpack local platform", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.add_middleware(TokenMiddleware, credentials=credentials,
                       token_file=home.token_file if home is not None else None)
    app.state.service = service
    # the same check, for the invocations' fast path (fast_invocations), which FastAPI's middleware never sees
    app.state.guard = TokenMiddleware(app, credentials, home.token_file if home is not None else None)
    background: set[asyncio.Task[object]] = set()

    @app.post("/2015-03-31/functions/{name}/invocations")
    async def lambda_invoke(name: str, request: Request) -> Response:
        kind = request.headers.get("x-amz-invocation-type", "RequestResponse")
        try:
            service.pool(name)
            payload = await request.body()
            if kind == "DryRun":
                return Response(status_code=204)
            if kind == "Event":
                task = asyncio.create_task(service.invoke(name, payload))
                background.add(task)
                task.add_done_callback(background.discard)
                return Response(status_code=202)
        except PlatformError as e:
            return _lambda_platform_error(e)
        return await _lambda_reply(service, name, payload)

    @app.post("/function/{name}")
    async def openfaas_invoke(name: str, request: Request) -> Response:
        try:
            reply = await service.invoke(name, await request.body())
        except PlatformError as e:
            return _json({"error": {"type": e.error_type, "message": e.message}}, e.status)
        except FunctionFailed as e:
            return _json({"error": {"type": e.flatpack_type, "message": e.message}}, e.status)
        return Response(reply.body, status_code=500 if reply.failed else 200,
                        media_type="application/octet-stream")

    @app.put("/flatpack/functions/{name}")
    async def register(name: str, request: Request) -> Response:
        try:
            check_name(name)
            doc = json.loads(await request.body() or b"{}")
            spec = FunctionSpec.from_json(doc, name=name)
            return _json(await service.register(spec), 201)
        except ValueError as e:  # includes JSONDecodeError
            return _bad_request(str(e))

    @app.put("/flatpack/bundles")
    async def stage_bundle(request: Request) -> Response:
        try:
            doc = json.loads(await request.body() or b"{}")
            source = doc.get("source") if isinstance(doc, dict) else None
            if not isinstance(source, str) or not source:
                raise ValueError('give the bundle\'s directory as {"source": "/path/to/bundle"}')
            staged = await service.stage_bundle(source)
        except ValueError as e:  # includes BundleError and JSONDecodeError
            return _bad_request(str(e))
        return _json({"bundle_dir": staged}, 201)

    @app.delete("/flatpack/functions/{name}")
    async def remove(name: str) -> Response:
        try:
            await service.remove(name)
        except PlatformError as e:
            return _json({"error": {"type": e.error_type, "message": e.message}}, e.status)
        return Response(status_code=204)

    @app.get("/flatpack/functions")
    async def list_functions() -> Response:
        return _json({"functions": service.describe()})

    @app.get("/flatpack/functions/{name}")
    async def describe(name: str) -> Response:
        try:
            return _json(service.pool(name).describe())
        except PlatformError as e:
            return _json({"error": {"type": e.error_type, "message": e.message}}, e.status)

    @app.get("/flatpack/meter")
    async def meter() -> Response:
        return _json(service.meter.snapshot())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.meter.prometheus_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"ok": True, "profile": service.profile.name, "functions": len(service.describe()),
                      "url": service.url, "cpu_limit": service.limiter.name, "cpu": service.cpu(),
                      "zygote": service.zygote.describe() if service.zygote is not None else None})

    return app
