"""OpenFaaS entry point for the python3-http template: ``handle(event, context)``.

The request body is a flatpack message (binary or JSON); the reply is the same form, with HTTP 500
when it carries a structured error (the OpenFaaS invoker reads the error from the body).
"""

from __future__ import annotations

from typing import Any

from functions.config import FunctionConfig
from functions.runtime import FunctionRuntime

__all__ = ["handle"]

_runtime: FunctionRuntime | None = None


def _get() -> FunctionRuntime:
    global _runtime
    if _runtime is None:
        _runtime = FunctionRuntime(FunctionConfig.from_env())
    return _runtime


def handle(event: Any, context: Any) -> dict[str, Any]:
    body = event.body if hasattr(event, "body") else event
    if isinstance(body, str):
        body = body.encode()
    reply, failed = _get().handle(bytes(body))
    return {
        "statusCode": 500 if failed else 200,
        "body": reply,
        "headers": {"Content-Type": "application/octet-stream"},
    }
