"""A small OpenFaaS gateway for the tests: the gateway's management API (``/system/functions``, basic
auth) and invoke route (``/function/NAME/...``) over the template's HTTP server (``index.py``, as
of-watchdog would start it) run as one process per function with the environment the deployer sent.

The local platform speaks the invoke route but not the management API, so the deployer runs against this.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.conftest import free_port

__all__ = ["Gateway", "start_server", "stop_server"]


def start_server(stack_root: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    full = {**os.environ, **env, "FLATPACK_PORT": str(port), "FLATPACK_FUNCTION_DIR": str(stack_root / "function")}
    proc = subprocess.Popen([sys.executable, "index.py"], cwd=stack_root / "template" / "flatpack", env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"index.py exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(f"{url}/_/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("index.py did not become ready in 60 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stderr:
        proc.stderr.close()



class Gateway:
    """``/system/functions`` (basic auth), ``/healthz`` and ``/function/NAME/...`` over index.py processes.

    ``stack_root``: the rendered stack whose ``function/`` folder a function runs (a real gateway pulls the
    image instead), or a callable that finds it from the deployment document the deployer POSTed."""

    def __init__(self, stack_root: Path | Callable[[dict], Path], user: str, password: str) -> None:
        self.root_for: Callable[[dict], Path] = stack_root if callable(stack_root) else (lambda _doc: stack_root)
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.functions: dict[str, tuple[subprocess.Popen, str]] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        gw = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes = b"", ctype: str = "application/json",
                       headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _system(self) -> bool:
                if self.headers.get("Authorization") != gw.auth:
                    self._body()
                    self._reply(401, b"unauthorized", "text/plain")
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/healthz":
                    self._reply(200, b"OK", "text/plain")
                    return
                if self.path.startswith("/system/function/") and self._system():
                    name = self.path.split("/")[3].split("?")[0]
                    with gw.lock:
                        known = name in gw.functions
                    if not known:
                        self._reply(404, b"not found", "text/plain")
                        return
                    self._reply(200, json.dumps({"name": name, "availableReplicas": 1}).encode())

            def do_DELETE(self) -> None:  # noqa: N802
                if self.path == "/system/functions" and self._system():
                    name = json.loads(self._body())["functionName"]
                    gw.requests.append(("DELETE", name))
                    with gw.lock:
                        entry = gw.functions.pop(name, None)
                    if entry is None:
                        self._reply(404, b"not found", "text/plain")
                        return
                    stop_server(entry[0])
                    self._reply(202)

            def do_POST(self) -> None:  # noqa: N802
                if self.path == "/system/functions":
                    if not self._system():
                        return
                    doc = json.loads(self._body())
                    gw.requests.append(("POST", doc["service"]))
                    assert doc["envProcess"] == "python index.py" and doc["limits"]["memory"].endswith("Mi")
                    proc, url = start_server(gw.root_for(doc), doc["envVars"])
                    with gw.lock:
                        gw.functions[doc["service"]] = (proc, url)
                    self._reply(202)
                    return
                if self.path.startswith("/function/"):
                    name, _, rest = self.path[len("/function/"):].partition("/")
                    body = self._body()
                    with gw.lock:
                        entry = gw.functions.get(name)
                    if entry is None:
                        self._reply(404, b"no such function", "text/plain")
                        return
                    hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                    req = urllib.request.Request(f"{entry[1]}/{rest}", data=body, headers=hdrs, method="POST")
                    try:
                        with urllib.request.urlopen(req, timeout=60) as r:
                            status, data, got = r.status, r.read(), r.headers
                    except urllib.error.HTTPError as e:
                        status, data, got = e.code, e.read(), e.headers
                    # the function's own headers pass through, as the gateway's reverse proxy passes them
                    extra = {k: v for k, v in got.items()
                             if k.lower() not in ("content-length", "content-type", "connection", "date", "server",
                                                  "transfer-encoding", "keep-alive")}
                    self._reply(status, data, got.get("Content-Type", ""), extra)
                    return
                self._reply(404, b"", "text/plain")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Gateway:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        for proc, _ in self.functions.values():
            stop_server(proc)
