"""AWS Lambda entry point: ``functions.handlers.aws_lambda.handler``.

The runtime is built on the first invocation of an execution environment and reused while it lives
(Lambda's own lifecycle owns it; a module-level instance is the documented way to keep state across
invocations). The deadline is the earlier of the event's and what Lambda says is left. A runtime that
cannot be built (bad bundle, missing setting) answers every invocation with an ``InitError`` reply, which
the master does not retry, and is tried again on the next invocation.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from functions.config import FunctionConfig
from functions.errors import InitError
from functions.event import Reply
from functions.runtime import FunctionRuntime

__all__ = ["handler"]

log = logging.getLogger(__name__)

_runtime: FunctionRuntime | None = None


def _get() -> FunctionRuntime:
    global _runtime
    if _runtime is None:
        _runtime = FunctionRuntime(FunctionConfig.from_env())
    return _runtime


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    deadline_ms = None
    if context is not None and hasattr(context, "get_remaining_time_in_millis"):
        # leave 200 ms to send the reply before Lambda kills the invocation
        deadline_ms = int(time.time() * 1000) + int(context.get_remaining_time_in_millis()) - 200
    try:
        runtime = _get()
    except Exception as e:  # noqa: BLE001 - a broken function answers with a structured, non-retried error
        log.exception("the function could not start")
        name = os.environ.get("FLATPACK_FUNCTION")
        return Reply.failure(InitError(f"the function could not start: {e}", function=name)).to_json_doc()
    return runtime.handle_doc(event, deadline_ms=deadline_ms)
