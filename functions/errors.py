"""Structured errors of the function runtime: what a part, a transport or an invocation can fail with.

Every error has a wire ``type`` (the name the reply carries, e.g. ``OutOfMemory``) and says whether
retrying can help. Parts are idempotent, so a crash, a timeout or a transient transport failure is worth
another attempt; a part that fails on its input, or needs more memory than its function has, is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "BadInput",
    "BadRequest",
    "FunctionError",
    "FunctionNotFound",
    "InitError",
    "InstanceCrashed",
    "InvokeError",
    "InvokeTimeout",
    "OutOfMemory",
    "PartError",
    "PayloadTooLarge",
    "Throttled",
    "TransportError",
    "error_from_json",
]


class FunctionError(RuntimeError):
    """Base of the runtime's errors. ``function`` names the function it happened in, when known."""

    type: ClassVar[str] = "FunctionError"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, function: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.function = function

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.function is not None:
            d["function"] = self.function
        return d

    def __str__(self) -> str:
        where = f"[{self.function}] " if self.function else ""
        return f"{self.type}: {where}{self.message}"


class PartError(FunctionError):
    """The part itself failed (onnxruntime rejected its input, a tensor is missing): not retried."""

    type = "PartError"


class BadRequest(FunctionError, ValueError):
    """The event is malformed or names a stage/part this function does not run."""

    type = "BadRequest"


class BadInput(FunctionError, ValueError):
    """The request's data is outside what the model takes (a token id past its embedding table): the
    client's error, named by the input it is in. Not retried."""

    type = "BadInput"


class OutOfMemory(FunctionError, MemoryError):
    """The instance went over its function's memory limit and was killed. Retrying would do the same."""

    type = "OutOfMemory"


class InvokeTimeout(FunctionError, TimeoutError):
    """No reply before the invocation's deadline."""

    type = "Timeout"
    retryable = True


class InstanceCrashed(FunctionError):
    """The instance died while serving the request (killed, segfault): another instance may succeed."""

    type = "Crashed"
    retryable = True


class Throttled(FunctionError):
    """The function is at its concurrency limit."""

    type = "Throttled"
    retryable = True


class InvokeError(FunctionError, ConnectionError):
    """The invocation itself failed (connection refused, HTTP 5xx from the platform)."""

    type = "InvokeError"
    retryable = True


class TransportError(FunctionError, ConnectionError):
    """A tensor could not be stored or fetched (store unreachable, key missing or expired)."""

    type = "TransportError"
    retryable = True


class FunctionNotFound(FunctionError, LookupError):
    type = "FunctionNotFound"


class InitError(FunctionError):
    """The function's instance could not start (bad bundle, missing dependency): not retried."""

    type = "InitError"


class PayloadTooLarge(FunctionError, ValueError):
    """A request or reply over the platform's payload limit."""

    type = "PayloadTooLarge"


_BY_TYPE: dict[str, type[FunctionError]] = {
    c.type: c
    for c in (
        FunctionError,
        PartError,
        BadRequest,
        BadInput,
        OutOfMemory,
        InvokeTimeout,
        InstanceCrashed,
        Throttled,
        InvokeError,
        TransportError,
        FunctionNotFound,
        InitError,
        PayloadTooLarge,
    )
}


def error_from_json(d: Mapping[str, Any], *, function: str | None = None) -> FunctionError:
    """The exception for a structured error ``{type, message[, function]}`` from a reply."""
    cls = _BY_TYPE.get(str(d.get("type")), FunctionError)
    err = cls(str(d.get("message", "")), function=d.get("function") or function)
    if cls is FunctionError and d.get("type"):
        err.message = f"{d.get('type')}: {err.message}"
    return err
