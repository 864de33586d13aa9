"""The Open Inference Protocol v2 routes of a master function: what every cloud handler serves over HTTP.

The AWS Lambda handler (HTTP API events, function URLs) and the OpenFaaS server turn their requests into an
:class:`HttpRequest`, call :meth:`InferenceRoutes.handle` and send back the :class:`HttpResponse`. The
routes are the local endpoint's (``serving.api``), with the same codec
(:mod:`functions.inference_protocol`) and the same error table (:mod:`functions.http_errors`):

* ``GET /v2/health/live`` (no token needed), ``GET /v2/health/ready`` (503 while the runtime cannot start)
* ``GET /v2``: server metadata
* ``GET /v2/models/{model}``, ``GET /v2/models/{model}/ready``
* ``POST /v2/models/{model}/infer``: JSON tensors or the binary tensor extension (the body gzip or deflate
  encoded when ``Content-Encoding`` says so), outputs as classes on request (the classification
  extension); the request runs as an ``infer`` event on this instance's runtime (the master role), in
  process.
* Triton's read-only extensions: ``GET /v2/models/{model}/config``, ``GET /v2/models/{model}/stats``,
  ``GET /v2/models/stats`` (this instance's requests since it started), ``POST /v2/repository/index``.
* Every model route also at ``/v2/models/{model}/versions/1/...``; another version is an unknown model.

With a token (``FLATPACK_API_TOKEN``) every route but liveness needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from functions.codec import encode
from functions.content_encoding import decode_body
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
    MODEL_VERSION,
    check_inputs,
    check_outputs,
    check_version,
    decode_request,
    encode_response,
    model_config,
    model_metadata,
    repository_index,
    server_metadata,
)
from functions.inference_stats import InferenceStats, statistics_document
from functions.runtime import FunctionRuntime

__all__ = ["HttpRequest", "HttpResponse", "InferenceRoutes"]

log = logging.getLogger(__name__)

_LIVE = "/v2/health/live"

#: what a gzip / deflate body may decode to when the routes have no body limit of their own
DEFAULT_DECODED_BODY_BYTES = 64 * 2**20


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
    max_body_bytes: bodies above this are refused with 413 (None: the platform's own limit applies, and
        an encoded body may decode to ``DEFAULT_DECODED_BODY_BYTES``).
    stats: the statistics to count requests in, by model name: the handler's, kept as long as the
        instance (None: these routes' own).
    """

    def __init__(self, runtime: Callable[[], FunctionRuntime], *, token: str | None = None,
                 max_body_bytes: int | None = None, stats: dict[str, InferenceStats] | None = None) -> None:
        self._runtime = runtime
        self._token = token
        self._max_body = max_body_bytes
        self._stats = stats if stats is not None else {}

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
        if parts[:2] != ["v2", "models"] and parts != ["v2", "repository", "index"]:
            raise RouteNotFound.at(method, path)
        rt = self._runtime()
        model = rt.config.model_name or rt.plan.model.name
        if parts == ["v2", "repository", "index"]:
            _only(method, "POST", path)
            return HttpResponse.json(200, repository_index({model: True}, request.body))
        if parts == ["v2", "models", "stats"]:
            _only(method, "GET", path)
            return HttpResponse.json(200, statistics_document([self._stats_of(model)]))
        return self._model_route(rt, model, parts[2:], request, deadline_ms)

    def _model_route(self, rt: FunctionRuntime, model: str, parts: list[str], request: HttpRequest,
                     deadline_ms: int | None) -> HttpResponse:
        """``parts``: the path after ``/v2/models/``: the model's name, ``versions/{v}`` or not, the route."""
        method, path = request.method.upper(), request.path
        if not parts:
            raise RouteNotFound.at(method, path)
        if parts[0] != model:
            raise ModelNotFound.named(parts[0], [model])
        rest = parts[1:]
        if rest[:1] == ["versions"] and len(rest) >= 2:
            check_version(model, rest[1])
            rest = rest[2:]
        specs = rt.plan.model
        if rest == []:
            _only(method, "GET", path)
            return HttpResponse.json(200, model_metadata(model, specs.inputs, specs.outputs))
        if rest == ["ready"]:
            _only(method, "GET", path)
            return HttpResponse.json(200, {"name": model, "ready": True})
        if rest == ["config"]:
            _only(method, "GET", path)
            return HttpResponse.json(200, model_config(model, specs.inputs, specs.outputs))
        if rest == ["stats"]:
            _only(method, "GET", path)
            return HttpResponse.json(200, statistics_document([self._stats_of(model)]))
        if rest == ["infer"]:
            _only(method, "POST", path)
            return self._infer(rt, model, request, deadline_ms)
        raise RouteNotFound.at(method, path)

    def _stats_of(self, model: str) -> InferenceStats:
        return self._stats.setdefault(model, InferenceStats(model, MODEL_VERSION))

    def _infer(self, rt: FunctionRuntime, model: str, request: HttpRequest, deadline_ms: int | None) -> HttpResponse:
        limit = self._max_body if self._max_body is not None else DEFAULT_DECODED_BODY_BYTES
        body = decode_body(request.body, request.headers.get("content-encoding"), limit)
        t0 = time.perf_counter_ns()
        decoded = decode_request(body, request.headers.get(HEADER_LENGTH.lower()))
        check_inputs(model, rt.plan.model.inputs, decoded.inputs)
        check_outputs(model, rt.plan.model.outputs, decoded.outputs, decoded.classes)
        t1 = time.perf_counter_ns()
        try:
            outputs = self._run(rt, decoded.inputs, deadline_ms)
        except BaseException:
            self._stats_of(model).failed(time.perf_counter_ns() - t0)
            raise
        t2 = time.perf_counter_ns()
        if decoded.outputs is not None:
            outputs = {name: outputs[name] for name in decoded.outputs}
        body, headers = encode_response(model, decoded, outputs)
        self._stats_of(model).succeeded(t1 - t0, t2 - t1, time.perf_counter_ns() - t2)
        return HttpResponse(200, headers, body)

    @staticmethod
    def _run(rt: FunctionRuntime, inputs: Mapping[str, np.ndarray], deadline_ms: int | None) -> dict[str, np.ndarray]:
        """The model's outputs: the inputs as an ``infer`` event on this instance's runtime."""
        deadline = deadline_ms if deadline_ms is not None else now_ms() + int(rt.config.invoke_timeout_ms)
        entries = tuple(TensorEntry(n, data=encode(np.ascontiguousarray(a))) for n, a in inputs.items())
        event = Event("infer", f"h{uuid.uuid4().hex[:16]}", rt.config.deployment, deadline, entries)
        reply = rt.handle_event(event, "json")
        if reply.error is not None:
            raise error_from_json(reply.error)
        return rt.channel("json").receive(reply.outputs, delete=True)


def _only(method: str, allowed: str, path: str) -> None:
    if method != allowed:
        raise MethodNotAllowed.at(method, path)
