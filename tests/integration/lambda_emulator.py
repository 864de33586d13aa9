"""AWS Lambda offline, control plane and invocations together, for a client that deploys and then invokes
through one endpoint (what `flatpack calibrate --platform aws-lambda --endpoint-url URL` does).

moto's server answers every AWS API (IAM, STS, S3, Lambda's CreateFunction, aliases, DeleteFunction) but
runs no function without Docker; serverless-offline runs functions but has no control plane. The
emulator is a front on one loopback port that sends ``Invoke`` to a serverless-offline serving that very
function (its code and settings as moto holds them: the zip the deployer uploaded, its environment,
memory and timeout; started on the first invocation, so that one is a cold start) and everything else to
moto. Deleting the function stops its serverless-offline.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import urllib.error
import urllib.request
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import yaml

from tests.conftest import free_port
from tests.integration.serverless import serverless_offline

__all__ = ["LambdaEmulator"]

_INVOKE = re.compile(r"^/2015-03-31/functions/([^/]+)/invocations")
_FUNCTION = re.compile(r"^/2015-03-31/functions/([^/?]+)/?(?:\?.*)?$")
_ACCOUNT = "123456789012"  # moto's


class LambdaEmulator:
    """``url``: the one endpoint; ``functions_running``: names with a serverless-offline now."""

    def __init__(self, sls: Path, root: Path, region: str = "us-east-1") -> None:
        from moto.server import ThreadedMotoServer

        self.sls, self.root, self.region = sls, root, region
        self._moto_port = free_port()
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self._moto_port, verbose=False)
        self._moto_url = f"http://127.0.0.1:{self._moto_port}"
        self._offline: dict[str, tuple[contextlib.ExitStack, str]] = {}
        self._lock = threading.Lock()
        self.started: list[str] = []  # function names, in the order their serverless-offline started
        emu = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _relay(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                m = _INVOKE.match(self.path)
                base = emu._moto_url
                if method == "POST" and m:
                    base = emu._serving(unquote(m.group(1)).split(":")[0])
                status, headers, data = _forward(method, base + self.path, self.headers, body)
                d = _FUNCTION.match(self.path)
                if method == "DELETE" and d and status < 300:
                    emu._stop(unquote(d.group(1)))
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._relay("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._relay("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._relay("PUT")

            def do_DELETE(self) -> None:  # noqa: N802
                self._relay("DELETE")

            def do_HEAD(self) -> None:  # noqa: N802
                self._relay("HEAD")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LambdaEmulator:
        self._moto.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        for name in list(self._offline):
            self._stop(name)
        self._moto.stop()

    @property
    def functions_running(self) -> list[str]:
        with self._lock:
            return sorted(self._offline)

    def _serving(self, name: str) -> str:
        """The Lambda port of the serverless-offline serving function ``name`` (started now if none is)."""
        with self._lock:
            if name in self._offline:
                return self._offline[name][1]
            stack = contextlib.ExitStack()
            out = self.root / f"{name}-{len(self.started)}"
            ports: dict[str, str] = {}

            def render(lambda_url: str) -> Path:
                ports["lambda"] = lambda_url
                return self._write_service(name, out)

            stack.enter_context(serverless_offline(self.sls, render, out.with_suffix(".log"), [], http=False))
            self._offline[name] = (stack, ports["lambda"])
            self.started.append(name)
            return ports["lambda"]

    def _write_service(self, name: str, out: Path) -> Path:
        """A one-function service of what moto holds for ``name``: its package, environment, memory, timeout."""
        from moto.awslambda.models import lambda_backends

        fn = lambda_backends[_ACCOUNT][self.region].get_function(name)
        out.mkdir(parents=True)
        with zipfile.ZipFile(io.BytesIO(fn.code_bytes)) as z:
            z.extractall(out)
        doc = {
            "service": re.sub(r"[^A-Za-z0-9-]", "-", name),
            "frameworkVersion": "3",
            "provider": {"name": "aws", "runtime": fn.run_time, "region": self.region},
            "plugins": ["serverless-offline"],
            "functions": {"fn": {"name": name, "handler": fn.handler, "memorySize": int(fn.memory_size),
                                 "timeout": int(fn.timeout), "environment": dict(fn.environment_vars)}},
        }
        (out / "serverless.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return out

    def _stop(self, name: str) -> None:
        with self._lock:
            entry = self._offline.pop(name, None)
        if entry is not None:
            entry[0].close()


def _forward(method: str, url: str, headers: object, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    hdrs = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}  # type: ignore[attr-defined]
    req = urllib.request.Request(url, data=body if method in ("POST", "PUT") else None, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return r.status, list(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        return e.code, list(e.headers.items()), e.read()
