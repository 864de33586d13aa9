"""The Open Inference Protocol v2 routes of a master function: what every cloud handler serves over HTTP.

The AWS Lambda handler (HTTP API events, function URLs) and the OpenFaaS server turn their requests into an
:class:`HttpRequest`, call :meth:`InferenceRoutes.handle` and send back the :class:`HttpResponse`. The
routes are the local endpoint's (``serving.api``), with the same codec
(:mod:`functions.inference_protocol`) and the same error table (:mod:`functions.http_errors`):

* ``GET /v2/health/live`` (no token needed), ``GET /v2/health/ready`` (503 while the runtime cannot start)
* ``GET /v2``: server metadata
* ``GET /v2/models/{model}``, ``GET /v2/models/{model}/ready``
* ``POST /v2/models/{model}/infer``: JSON tensors or the binary tensor extension; the request runs as an
  ``infer`` event on this instance's runtime (the master role), in process.

With a token (``FLATPACK_API_TOKEN``) every route but liveness needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from functions.codec import encode
from functions.errors import InitError, error_from_json
from functions.event import Event, TensorEntry, now_ms
from functions.http_errors import (
    MethodNotAllowed,
    ModelNotFound,
    RequestTooLarge,
    RouteNotFound,
    Unauthorized,
    error_response,
)
from functions.inference_protocol import (
    HEADER_LENGTH,
    check_inputs,
    check_outputs,
    decode_request,
    encode_response,
    model_metadata,
    server_metadata,
)
from functions.runtime import FunctionRuntime

__all__ = ["HttpRequest", "HttpResponse", "InferenceRoutes"]

log = logging.getLogger(__name__)

_LIVE = "/v2/health/live"


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request; ``headers`` with lower-case names, ``path`` without the query string."""

    method: str
    path: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class HttpResponse:
    """One HTTP response; ``headers`` with lower-case names (``content-type`` always set)."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @classmethod
    def json(cls, status: int, doc: Any) -> HttpResponse:
        return cls(status, {"content-type": "application/json"}, json.dumps(doc, separators=(",", ":")).encode())

    @classmethod
    def error(cls, exc: BaseException) -> HttpResponse:
        err = error_response(exc)
        return cls(err.status, dict(err.headers), err.body)

    @property
    def is_json(self) -> bool:
        return self.headers.get("content-type", "").startswith("application/json")


class InferenceRoutes:
    """The routes over one instance's runtime.

    Parameters
    ----------
    runtime: the instance's runtime, built on first use (raises InitError when it cannot start).
    token: the bearer token every route but liveness requires (None: no authentication).
    max_body_bytes: bodies above this are refused with 413 (None: the platform's own limit applies).
    """

    def __init__(self, runtime: Callable[[], FunctionRuntime], *, token: str | None = None,
                 max_body_bytes: int | None = None) -> None:
        self._runtime = runtime
        self._token = token
        self._max_body = max_body_bytes

    def handle(self, request: HttpRequest, *, deadline_ms: int | None = None) -> HttpResponse:
        """The response to ``request``; an inference runs until ``deadline_ms`` (Unix ms; None: the
        runtime's invoke timeout from now). Never raises: every failure is an error response."""
        try:
            return self._route(request, deadline_ms)
        except Exception as e:  # noqa: BLE001 - every error has its answer in the one table
            response = HttpResponse.error(e)
            if response.status >= 500:
                log.warning("%s %s failed: %s", request.method, request.path, e, exc_info=response.status == 500)
            return response

    def _authorized(self, request: HttpRequest) -> bool:
        if not self._token:
            return True
        got = request.headers.get("authorization", "")
        return got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), self._token.encode())

    def _route(self, request: HttpRequest, deadline_ms: int | None) -> HttpResponse:
        method, path = request.method.upper(), request.path
        if path == _LIVE:
            if method != "GET":
                raise MethodNotAllowed.at(method, path)
            return HttpResponse.json(200, {"live": True})
        if not self._authorized(request):
            raise Unauthorized.bearer()
        if self._max_body is not None and len(request.body) > self._max_body:
            raise RequestTooLarge.over(self._max_body, len(request.body))
        parts = [p for p in path.split("/") if p]
        if parts == ["v2", "health", "ready"]:
            _only(method, "GET", path)
            try:
                self._runtime()
            except InitError as e:
                log.warning("not ready: %s", e)
                return HttpResponse.json(503, {"ready": False})
            return HttpResponse.json(200, {"ready": True})
        if parts == ["v2"]:
            _only(method, "GET", path)
            return HttpResponse.json(200, server_metadata())
        if len(parts) < 3 or len(parts) > 4 or parts[:2] != ["v2", "models"]:
            raise RouteNotFound.at(method, path)
        rt = self._runtime()
        model = rt.config.model_name or rt.plan.model.name
        if parts[2] != model:
            raise ModelNotFound.named(parts[2], [model])
        rest = parts[3:]
        if rest == []:
            _only(method, "GET", path)
            return HttpResponse.json(200, model_metadata(model, rt.plan.model.inputs, rt.plan.model.outputs))
        if rest == ["ready"]:
            _only(method, "GET", path)
            return HttpResponse.json(200, {"name": model, "ready": True})
        if rest == ["infer"]:
            _only(method, "POST", path)
            return self._infer(rt, model, request, deadline_ms)
        raise RouteNotFound.at(method, path)

    def _infer(self, rt: FunctionRuntime, model: str, request: HttpRequest, deadline_ms: int | None) -> HttpResponse:
        decoded = decode_request(request.body, request.headers.get(HEADER_LENGTH.lower()))
        check_inputs(model, rt.plan.model.inputs, decoded.inputs)
        check_outputs(model, rt.plan.model.outputs, decoded.outputs)
        deadline = deadline_ms if deadline_ms is not None else now_ms() + int(rt.config.invoke_timeout_ms)
        entries = tuple(TensorEntry(n, data=encode(np.ascontiguousarray(a))) for n, a in decoded.inputs.items())
        event = Event("infer", f"h{uuid.uuid4().hex[:16]}", rt.config.deployment, deadline, entries)
        reply = rt.handle_event(event, "json")
        if reply.error is not None:
            raise error_from_json(reply.error)
        outputs = rt.channel("json").receive(reply.outputs, delete=True)
        if decoded.outputs is not None:
            outputs = {name: outputs[name] for name in decoded.outputs}
        body, headers = encode_response(model, decoded, outputs)
        return HttpResponse(200, headers, body)


def _only(method: str, allowed: str, path: str) -> None:
    if method != allowed:
        raise MethodNotAllowed.at(method, path)
