"""Errors of the inference endpoint and the one place that maps them to HTTP status codes."""

from __future__ import annotations

__all__ = ["STATUS", "ApiError", "InvalidInput", "ModelNotFound", "NotReady", "Overloaded", "PayloadTooLarge",
           "Unauthorized", "UpstreamError"]


class ApiError(Exception):
    """Base of the endpoint's errors; ``str(e)`` is what the client reads in ``{"error": ...}``."""


class InvalidInput(ApiError, ValueError):
    """The client's request is malformed or does not match the model (400)."""


class ModelNotFound(ApiError, LookupError):
    """No model of that name is served here (404)."""


class PayloadTooLarge(ApiError, ValueError):
    """The request body exceeds the configured limit (413)."""


class NotReady(ApiError, RuntimeError):
    """The model's functions are not up (503)."""


class Overloaded(NotReady):
    """The model's functions are all busy (the platform throttled the request): 503 with Retry-After."""

    retry_after_s = 1


class Unauthorized(ApiError, PermissionError):
    """Missing or wrong bearer token (401)."""


class UpstreamError(ApiError, RuntimeError):
    """The functions failed to answer (502); the message says which part and why."""


STATUS: dict[type[ApiError], int] = {
    InvalidInput: 400,
    Unauthorized: 401,
    ModelNotFound: 404,
    PayloadTooLarge: 413,
    UpstreamError: 502,
    NotReady: 503,
}
