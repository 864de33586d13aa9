"""The AWS Lambda handler: ``functions.handlers.aws_lambda.handler`` (``flatpack_entry.handler`` in a
rendered package, which puts the vendored wheels on ``sys.path`` and re-exports it).

Two kinds of events reach it:

* **HTTP requests** on the master: HTTP API events (payload format 2.0, or the REST API's 1.0) and
  function URL requests (2.0), served by :class:`functions.handlers.routes.InferenceRoutes` — the Open
  Inference Protocol v2 with the local endpoint's codec and error table. An inference runs until the
  deadline Lambda's context says is left (less a margin to send the reply).
* **flatpack function events** (the master invoking its workers with boto3): run by
  :meth:`functions.runtime.FunctionRuntime.handle_doc`, with the same deadline.

The runtime is built on the first invocation of an execution environment (the cold start: see
:mod:`functions.handlers.cold_start`, which fetches the bundle from S3 first when it is there) and kept
while the environment lives — a module-level instance is the documented way to keep state across
invocations. A runtime that cannot be built answers each invocation with an ``InitError`` (a function
event: the structured error reply, which the master does not retry; an HTTP request: 502 with
``{"error": "InitError: ..."}``) and is tried again on the next one. Nothing escapes the handler: the
Lambda runtime would report an escaped exception as ``Unhandled`` (and serverless-offline hangs on one).
"""

from __future__ import annotations

import base64
import logging
import time
from typing import Any

from functions.errors import FunctionError, PartError
from functions.event import Reply, now_ms
from functions.handlers.instance import Instance
from functions.handlers.routes import HttpRequest, HttpResponse, InferenceRoutes
from functions.runtime import FunctionRuntime
from functions.settings import api_token

__all__ = ["REPLY_MARGIN_MS", "handler", "runtime"]

log = logging.getLogger(__name__)

#: the time kept back from Lambda's deadline to encode and return the reply
REPLY_MARGIN_MS = 250

#: this process's instance: its runtime and inference statistics, kept across the events it serves
_instance = Instance()


def runtime() -> FunctionRuntime:
    """This execution environment's runtime, built on first use. Raises InitError."""
    return _instance.runtime()


def _deadline_ms(context: Any) -> int | None:
    if context is not None and hasattr(context, "get_remaining_time_in_millis"):
        return now_ms() + int(context.get_remaining_time_in_millis()) - REPLY_MARGIN_MS
    return None


def _is_http(event: Any) -> bool:
    return isinstance(event, dict) and "requestContext" in event and ("rawPath" in event or "httpMethod" in event)


def _http_request(event: dict[str, Any]) -> HttpRequest:
    ctx = event.get("requestContext") or {}
    http = ctx.get("http") or {}
    method = str(http.get("method") or event.get("httpMethod") or "GET").upper()
    path = str(event.get("rawPath") or http.get("path") or event.get("path") or "/")
    stage = ctx.get("stage")
    if stage and stage != "$default" and path.startswith(f"/{stage}/"):
        path = path[len(stage) + 1:]
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    raw = event.get("body") or ""
    body = base64.b64decode(raw) if event.get("isBase64Encoded") else str(raw).encode("utf-8")
    return HttpRequest(method, path, headers, body)


def _http_response(response: HttpResponse) -> dict[str, Any]:
    if response.is_json:
        return {"statusCode": response.status, "headers": dict(response.headers),
                "body": response.body.decode("utf-8"), "isBase64Encoded": False}
    return {"statusCode": response.status, "headers": dict(response.headers),
            "body": base64.b64encode(response.body).decode("ascii"), "isBase64Encoded": True}


def handler(event: Any, context: Any) -> dict[str, Any]:
    """The Lambda handler: OIP v2 over HTTP events, flatpack function events otherwise."""
    t0 = time.perf_counter()
    deadline_ms = _deadline_ms(context)
    if _is_http(event):
        try:
            routes = InferenceRoutes(runtime, token=api_token(), stats=_instance.stats)
            return _http_response(routes.handle(_http_request(event), deadline_ms=deadline_ms))
        except Exception as e:  # noqa: BLE001 - a malformed event still gets an HTTP answer, never an escape
            log.exception("HTTP event failed")
            return _http_response(HttpResponse.error(e))
        finally:
            _instance.after_event()
    try:
        rt = runtime()
        return rt.handle_doc(event, deadline_ms=deadline_ms)
    except FunctionError as e:  # InitError: a structured reply the master does not retry
        log.error("%s", e)
        return Reply.failure(e, timings={"total_ms": 1e3 * (time.perf_counter() - t0)}).to_json_doc()
    except Exception as e:  # noqa: BLE001 - handle_doc answers every error; this is the backstop
        log.exception("function event failed")
        err = PartError(f"unexpected error: {e!r}", function=_instance.function)
        return Reply.failure(err, timings={"total_ms": 1e3 * (time.perf_counter() - t0)}).to_json_doc()
    finally:
        _instance.after_event()
