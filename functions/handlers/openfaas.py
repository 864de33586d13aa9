"""The OpenFaaS function server: what of-watchdog (HTTP mode) forwards each request to.

The ``flatpack`` OpenFaaS template (``templates/openfaas/flatpack``) runs :func:`main` from its
``index.py``. Standard library only (besides the function runtime); one request at a time, like a Lambda
instance and like ``max_inflight=1`` in the watchdog. Routes:

* ``POST /`` (any path outside ``/v2/`` and ``/_/``): a flatpack message (binary or JSON) run by
  :meth:`functions.runtime.FunctionRuntime.handle`; HTTP 500 when the reply carries a structured error
  (the OpenFaaS invoker reads it from the body).
* ``/v2/...``: the Open Inference Protocol v2 on the master (:class:`functions.handlers.routes.InferenceRoutes`,
  the routes the Lambda handler serves).
* ``GET /_/ready`` (200 once the runtime is loaded, 503 while it cannot start), ``GET /_/health``.

Settings of the server itself: ``FLATPACK_HOST`` (default 127.0.0.1: the watchdog is in the same
container), ``FLATPACK_PORT`` (default 5000), ``FLATPACK_MAX_BODY_BYTES`` (default 256 MiB; 413 above).
The runtime is loaded before the port opens, so the first request is warm; one that cannot start is tried
again on the next request. :func:`handle` serves the same flatpack messages under OpenFaaS's stock
``python3-http`` template.
"""

from __future__ import annotations

import logging
import os
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from functions.errors import FunctionError, PartError
from functions.event import Reply
from functions.handlers.instance import Instance
from functions.handlers.routes import HttpRequest, HttpResponse, InferenceRoutes
from functions.http_errors import RequestTooLarge, RouteNotFound
from functions.runtime import FunctionRuntime
from functions.settings import api_token, log_level

__all__ = ["handle", "handle_message", "main", "runtime"]

log = logging.getLogger(__name__)

_DEFAULT_MAX_BODY = 256 * 2**20

#: this process's instance: its runtime and inference statistics, kept across the events it serves
_instance = Instance()


def runtime() -> FunctionRuntime:
    """This replica's runtime, built on first use. Raises InitError."""
    return _instance.runtime()


def handle_message(payload: bytes) -> HttpResponse:
    """A flatpack message in, the reply in the same form out: 200, or 500 when it carries an error."""
    try:
        reply, failed = runtime().handle(payload)
    except FunctionError as e:  # InitError
        log.error("%s", e)
        return HttpResponse(500, {"content-type": "application/json"}, Reply.failure(e).encode("json"))
    except Exception as e:  # noqa: BLE001 - the runtime turns failures into replies; this is the backstop
        log.exception("unexpected failure")
        err = PartError(f"unexpected error: {e!r}", function=_instance.function)
        return HttpResponse(500, {"content-type": "application/json"}, Reply.failure(err).encode("json"))
    finally:
        _instance.after_event()
    return HttpResponse(500 if failed else 200, {"content-type": "application/octet-stream"}, reply)


def handle(event: Any, context: Any) -> dict[str, Any]:
    """OpenFaaS's ``python3-http`` template entry point: ``event.body`` is a flatpack message."""
    body = event.body if hasattr(event, "body") else event
    if isinstance(body, str):
        body = body.encode()
    response = handle_message(bytes(body))
    return {"statusCode": response.status, "body": response.body, "headers": {"Content-Type":
                                                                             response.headers["content-type"]}}


def _int_setting(name: str, default: int) -> int:
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


class _Server(HTTPServer):
    def __init__(self, address: tuple[str, int], *, max_body: int) -> None:
        super().__init__(address, _Handler)
        self.max_body = max_body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "flatpack-openfaas"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, response: HttpResponse) -> None:
        self.send_response(response.status)
        for k, v in response.headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        self.wfile.write(response.body)

    def _body(self) -> bytes | None:
        """The request body; None when it is over the limit (answered 413 without reading it)."""
        n = int(self.headers.get("Content-Length") or 0)
        if n > self.server.max_body:
            self.close_connection = True
            self._send(HttpResponse.error(RequestTooLarge.over(self.server.max_body, n)))
            return None
        return self.rfile.read(n) if n else b""

    def _serve(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        if method == "GET" and path == "/_/health":
            self._send(HttpResponse.json(200, {"ok": True}))
            return
        if method == "GET" and path == "/_/ready":
            try:
                runtime()
            except FunctionError as e:
                self._send(HttpResponse.json(503, {"ready": False, "error": str(e)}))
                return
            self._send(HttpResponse.json(200, {"ready": True, "error": None}))
            return
        body = self._body()  # any method's body, read whole, so that the connection stays usable
        if body is None:
            return
        if path.startswith("/v2/") or path == "/v2":
            request = HttpRequest(method, path, {k.lower(): v for k, v in self.headers.items()}, body)
            try:
                self._send(InferenceRoutes(runtime, token=api_token(), stats=_instance.stats).handle(request))
            finally:
                _instance.after_event()
            return
        if method == "POST":
            self._send(handle_message(body))
            return
        self._send(HttpResponse.error(RouteNotFound.at(method, path)))

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("POST")

    # the other methods get the routes' answer (405 or 404 with an error body), not http.server's 501 page
    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("PUT")

    def do_DELETE(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("PATCH")


def main() -> None:
    """Load the runtime, then serve on ``FLATPACK_HOST:FLATPACK_PORT`` until interrupted."""
    logging.basicConfig(level=log_level(), format="%(levelname)s %(name)s: %(message)s")
    try:
        runtime()
    except FunctionError as e:  # reported on every request and by /_/ready; the server stays up
        log.error("the function failed to start: %s", e)
    host = (os.environ.get("FLATPACK_HOST") or "").strip() or "127.0.0.1"
    port = _int_setting("FLATPACK_PORT", 5000)
    server = _Server((host, port), max_body=_int_setting("FLATPACK_MAX_BODY_BYTES", _DEFAULT_MAX_BODY))
    log.info("flatpack function listening on %s:%d", host, server.server_address[1])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        _instance.close()
