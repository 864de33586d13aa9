"""The invoker interface: send a payload to a named function, get its reply payload back.

An invoker raises a :class:`functions.errors.FunctionError` for what went wrong *around* the function
(unreachable platform, throttling, the instance crashed, ran out of memory or out of time); a reply that
carries the function's own structured error is returned like any reply and judged by the caller.
"""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from functions.errors import (
    BadRequest,
    FunctionError,
    FunctionNotFound,
    InitError,
    InstanceCrashed,
    InvokeError,
    InvokeTimeout,
    OutOfMemory,
    PartError,
    PayloadTooLarge,
    Throttled,
)
from functions.event import Wire

__all__ = ["Invoker", "lambda_function_error", "status_error"]


class Invoker(ABC):
    """Invokes functions synchronously. Implementations are thread-safe."""

    #: the message form this invoker's target accepts (AWS Lambda handlers get JSON).
    wire: ClassVar[Wire] = "binary"

    @abstractmethod
    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        """The reply payload of ``function`` run on ``payload``, within ``timeout_s`` seconds."""

    def start(self, function: str, payload: bytes, *, timeout_s: float) -> Callable[[], bytes]:
        """Begin an invocation: where the invoker can, the request is on the wire when this returns; the
        returned callable waits for the reply payload (once, from any thread) and raises as :meth:`invoke`
        does. The default sends nothing until the callable runs. A caller that starts several invocations
        from one thread this way sends them one after another without a thread per send."""
        return functools.partial(self.invoke, function, payload, timeout_s=timeout_s)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


def lambda_function_error(function: str, body: bytes) -> FunctionError:
    """The error for an AWS-Lambda-style unhandled function error (``X-Amz-Function-Error`` set).

    The body is ``{"errorType", "errorMessage"}``; the types are Lambda's own (``Runtime.OutOfMemory``,
    ``Runtime.ExitError``, ``Sandbox.Timedout``, ...), which the local platform also uses.
    """
    try:
        doc = json.loads(body)
        etype, msg = str(doc.get("errorType", "")), str(doc.get("errorMessage", ""))
    except (ValueError, AttributeError):
        etype, msg = "", body[:500].decode("utf-8", "replace")
    if "OutOfMemory" in etype:
        return OutOfMemory(msg, function=function)
    if etype == "Sandbox.Timedout" or "timed out" in msg.lower():
        return InvokeTimeout(msg, function=function)
    if etype in ("Runtime.ExitError", "Runtime.Crashed"):
        return InstanceCrashed(msg, function=function)
    if etype.startswith("Runtime.Init") or etype in ("Runtime.ImportModuleError", "Runtime.HandlerNotFound"):
        return InitError(msg, function=function)
    if etype == "Function.ResponseSizeTooLarge":
        return PayloadTooLarge(msg, function=function)
    return PartError(f"{etype or 'unhandled error'}: {msg}", function=function)


def status_error(function: str, status: int, body: bytes, *, where: str) -> FunctionError:
    """The error for a non-success HTTP status from a platform (not from the function itself)."""
    text = body[:500].decode("utf-8", "replace").strip()
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            text = str(doc.get("message") or doc.get("Message") or doc.get("error") or text)
    except ValueError:
        pass
    msg = f"{where} answered HTTP {status}: {text}"
    if status == 404:
        return FunctionNotFound(f"no function {function!r} on {where}; deploy it first ({text})", function=function)
    if status == 429:
        return Throttled(msg, function=function)
    if status == 413:
        return PayloadTooLarge(msg, function=function)
    if status in (408, 504):
        return InvokeTimeout(msg, function=function)
    if 400 <= status < 500:
        return BadRequest(msg, function=function)
    return InvokeError(msg, function=function)
