"""The errors an inference endpoint answers with, and the one table mapping every error to its HTTP answer.

Every HTTP front-end of flatpack — the local endpoint (``serving.api``) and the handlers each cloud target
ships (``functions.handlers``) — turns an exception into its response with :func:`error_response`, so the
same error has the same status, headers and JSON body ``{"error": "..."}`` on every target:

====================================================  ======  =================================================
error                                                 status  why
====================================================  ======  =================================================
:class:`InvalidInput`                                 400     the request is malformed or not what the model
                                                              takes (the client's mistake, never a 5xx)
``BadInput``                                          400     the request's data is outside what the model
                                                              takes (a token id past its embedding table),
                                                              found where a part runs; names the input
:class:`Unauthorized`                                 401     missing or wrong bearer token
                                                              (``WWW-Authenticate: Bearer``)
:class:`ModelNotFound`, :class:`RouteNotFound`        404     no such model / route here
:class:`MethodNotAllowed`                             405     the route takes another method
:class:`RequestTooLarge`                              413     the body (or what it decodes to) is over the
                                                              endpoint's limit
:class:`UnsupportedEncoding`                          415     a ``Content-Encoding`` other than gzip, deflate
                                                              or identity
:class:`NotReady`                                     503     the model's functions are not up yet
``Throttled``                                         503     every instance is busy at the concurrency limit:
                                                              a server-side capacity limit (RFC 9110 §15.6.4),
                                                              with ``Retry-After: 1``. Not 429, which is
                                                              per-client rate limiting.
``Timeout``                                           504     a function did not answer in time: the endpoint
                                                              is a gateway in front of the functions
``OutOfMemory``                                       502     a function went over its memory size: the
                                                              upstream function failed (507 is about storage)
``InitError``                                         502     a function could not start (bad bundle, missing
                                                              setting): the upstream function failed
any other function error (``PartError``, ``Crashed``,  502     the functions failed to answer
``InvokeError``, ``TransportError``, ``BadRequest``
of an event, ``PayloadTooLarge`` between functions,
...), :class:`UpstreamError`
anything else                                         500     a bug; the body names the exception
====================================================  ======  =================================================

The body of an endpoint error (the first rows) is its message; the body of a function error names its type
and where it happened, as :class:`functions.errors.FunctionError` prints it
(``"OutOfMemory: [fn] fn ran out of memory: ..."``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from functions.errors import BadInput, FunctionError, InitError, InvokeTimeout, OutOfMemory, Throttled

__all__ = [
    "STATUS_TABLE",
    "ApiError",
    "ErrorResponse",
    "InvalidInput",
    "MethodNotAllowed",
    "ModelNotFound",
    "NotReady",
    "RequestTooLarge",
    "RouteNotFound",
    "StatusRule",
    "Unauthorized",
    "UnsupportedEncoding",
    "UpstreamError",
    "error_body",
    "error_response",
]


class ApiError(Exception):
    """Base of the endpoint's own errors; ``str(e)`` is what the client reads in ``{"error": ...}``."""


class InvalidInput(ApiError, ValueError):
    """The client's request is malformed or does not match the model."""


class Unauthorized(ApiError, PermissionError):
    """Missing or wrong bearer token."""

    @classmethod
    def bearer(cls) -> Unauthorized:
        return cls("missing or wrong bearer token")


class ModelNotFound(ApiError, LookupError):
    """No model of that name is served here."""

    @classmethod
    def named(cls, name: str, served: Sequence[str]) -> ModelNotFound:
        return cls(f"model {name!r} is not served here; models: {list(served)}")

    @classmethod
    def version(cls, name: str, version: str, versions: Sequence[str]) -> ModelNotFound:
        return cls(f"model {name!r} has no version {version!r}; versions: {list(versions)}")


class RouteNotFound(ApiError, LookupError):
    """No route at that path."""

    @classmethod
    def at(cls, method: str, path: str) -> RouteNotFound:
        return cls(f"no route {method} {path}")


class MethodNotAllowed(ApiError):
    """The route exists, for another method."""

    @classmethod
    def at(cls, method: str, path: str) -> MethodNotAllowed:
        return cls(f"method {method} is not allowed on {path}")


class RequestTooLarge(ApiError, ValueError):
    """The request body exceeds the endpoint's limit."""

    @classmethod
    def over(cls, limit: int, size: int | None = None) -> RequestTooLarge:
        if size is None:
            return cls(f"request body exceeds the {limit} byte limit")
        return cls(f"request body of {size} bytes exceeds the {limit} byte limit")


class UnsupportedEncoding(ApiError, ValueError):
    """The request body's ``Content-Encoding`` is not one the endpoint decodes."""


class NotReady(ApiError, RuntimeError):
    """The model's functions are not up yet."""


class UpstreamError(ApiError, RuntimeError):
    """The functions failed in a way that carries no function error type (e.g. an in-process backend
    raised); the message says why."""


@dataclass(frozen=True)
class StatusRule:
    """Errors of class ``error`` are answered with ``status`` (and ``Retry-After`` when set)."""

    error: type[BaseException]
    status: int
    why: str
    retry_after_s: int | None = None


#: first match wins: the specific function errors come before their base class
STATUS_TABLE: tuple[StatusRule, ...] = (
    StatusRule(InvalidInput, 400, "the request is malformed or not what the model takes"),
    StatusRule(BadInput, 400, "the request's data is outside what the model takes (an index out of range)"),
    StatusRule(Unauthorized, 401, "missing or wrong bearer token"),
    StatusRule(ModelNotFound, 404, "no such model here"),
    StatusRule(RouteNotFound, 404, "no such route"),
    StatusRule(MethodNotAllowed, 405, "the route takes another method"),
    StatusRule(RequestTooLarge, 413, "the body is over the endpoint's limit"),
    StatusRule(UnsupportedEncoding, 415, "the body's content coding is not gzip, deflate or identity"),
    StatusRule(NotReady, 503, "the model's functions are not up yet"),
    StatusRule(Throttled, 503, "the functions are at their concurrency limit (server-side capacity)", 1),
    StatusRule(InvokeTimeout, 504, "a function did not answer in time (the endpoint is their gateway)"),
    StatusRule(OutOfMemory, 502, "a function went over its memory size"),
    StatusRule(InitError, 502, "a function could not start"),
    StatusRule(FunctionError, 502, "the functions failed to answer"),
    StatusRule(UpstreamError, 502, "the functions failed to answer"),
)


@dataclass(frozen=True)
class ErrorResponse:
    """An error as HTTP: status, headers (lower-case names) and the JSON body ``{"error": message}``."""

    status: int
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def body(self) -> bytes:
        return error_body(self.message)


def error_body(message: str) -> bytes:
    """``{"error": message}`` as the bytes every front-end sends."""
    return json.dumps({"error": message}, separators=(",", ":"), ensure_ascii=False).encode()


def error_response(exc: BaseException) -> ErrorResponse:
    """The HTTP answer to ``exc`` (see the table in this module's docstring)."""
    rule = next((r for r in STATUS_TABLE if isinstance(exc, r.error)), None)
    headers: dict[str, str] = {"content-type": "application/json"}
    if rule is None:
        return ErrorResponse(500, f"{type(exc).__name__}: {exc}", headers)
    if isinstance(exc, Unauthorized):
        headers["www-authenticate"] = "Bearer"
    if rule.retry_after_s is not None:
        headers["retry-after"] = str(rule.retry_after_s)
    return ErrorResponse(rule.status, str(exc), headers)
