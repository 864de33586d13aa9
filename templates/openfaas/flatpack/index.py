"""The flatpack template's server: what of-watchdog (HTTP mode) forwards each request to.

Standard library only (besides the function runtime): one request at a time, like a Lambda instance and
like ``max_inflight=1`` in the watchdog. Routes:

* ``POST /`` (any path outside ``/v2/`` and ``/_/``): a flatpack message (binary or JSON), run by
  :meth:`functions.runtime.FunctionRuntime.handle` exactly as ``functions.handlers.openfaas.handle`` does;
  HTTP 500 when the reply carries a structured error (the OpenFaaS invoker reads it from the body).
* ``/v2/...``: the Open Inference Protocol v2 on the master (``flatpack_entry``'s HTTP adapter).
* ``GET /_/ready`` (200 once the runtime is loaded, 503 before or if it failed), ``GET /_/health``.

Binds ``FLATPACK_HOST`` (default 127.0.0.1: the watchdog is in the same container) on ``FLATPACK_PORT``
(default 5000). The runtime is loaded before the port opens, so the first request is warm.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

_FUNCTION_DIR = Path(os.environ.get("FLATPACK_FUNCTION_DIR") or Path(__file__).resolve().parent / "function")
sys.path.insert(0, str(_FUNCTION_DIR))

import flatpack_entry  # noqa: E402 - the handler folder must be on sys.path first

log = logging.getLogger("flatpack.openfaas")

_MAX_BODY = int(os.environ.get("FLATPACK_MAX_BODY_BYTES", str(256 * 2**20)))


class _State:
    def __init__(self) -> None:
        self.runtime: Any = None
        self.error: str | None = None

    def load(self) -> None:
        try:
            self.runtime = flatpack_entry.runtime()
        except Exception as e:  # noqa: BLE001 - reported on every request and by /_/ready; the server stays up
            self.error = f"{type(e).__name__}: {e}"
            log.error("flatpack function failed to start: %s", self.error)


_state = _State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "flatpack-openfaas"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        hdrs = {"Content-Type": "application/octet-stream", **(headers or {})}
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode(), {"Content-Type": "application/json"})

    def _body(self) -> bytes | None:
        n = int(self.headers.get("Content-Length") or 0)
        if n > _MAX_BODY:
            self._json(413, {"error": f"request body of {n} bytes is over the {_MAX_BODY}-byte limit"})
            return None
        return self.rfile.read(n) if n else b""

    def _oip(self, method: str) -> None:
        body = self._body() if method == "POST" else b""
        if body is None:
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = self.path.split("?", 1)[0]
        reply = flatpack_entry.handler(flatpack_entry.http_event(method, path, headers, body), None)
        raw = reply.get("body") or ""
        data = base64.b64decode(raw) if reply.get("isBase64Encoded") else str(raw).encode()
        self._send(int(reply.get("statusCode", 500)), data, dict(reply.get("headers") or {}))

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/_/health":
            self._json(200, {"ok": True})
        elif path == "/_/ready":
            ok = _state.runtime is not None
            self._json(200 if ok else 503, {"ready": ok, "error": _state.error})
        elif path.startswith("/v2/"):
            self._oip("GET")
        else:
            self._json(404, {"error": f"no route GET {path}; POST a flatpack event to /"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path.startswith("/v2/"):
            self._oip("POST")
            return
        body = self._body()
        if body is None:
            return
        if _state.runtime is None:
            err = {"error": {"type": "InitError", "message": _state.error or "the runtime is not loaded",
                             "function": os.environ.get("FLATPACK_FUNCTION")}}
            self._json(500, err)
            return
        try:
            reply, failed = _state.runtime.handle(body)
        except Exception as e:  # noqa: BLE001 - the runtime turns failures into replies; this is the backstop
            log.exception("unexpected failure")
            self._json(500, {"error": {"type": "PartError", "message": f"{type(e).__name__}: {e}"}})
            return
        self._send(500 if failed else 200, reply)


def main() -> None:
    logging.basicConfig(level=os.environ.get("FLATPACK_LOG_LEVEL", "WARNING"),
                        format="%(levelname)s %(name)s: %(message)s")
    _state.load()
    host = os.environ.get("FLATPACK_HOST", "127.0.0.1")
    port = int(os.environ.get("FLATPACK_PORT", "5000"))
    server = HTTPServer((host, port), Handler)
    log.info("flatpack function %s listening on %s:%d", os.environ.get("FLATPACK_FUNCTION"), host,
                server.server_address[1])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if _state.runtime is not None:
            _state.runtime.close()


if __name__ == "__main__":
    main()
