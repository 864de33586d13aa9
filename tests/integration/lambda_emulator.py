"""AWS Lambda offline, control plane and invocations together, for a client that deploys and then invokes
through one endpoint (what `flatpack calibrate --platform aws-lambda --endpoint-url URL` does).

moto's server answers every AWS API (IAM, STS, S3, Lambda's CreateFunction, aliases, DeleteFunction) but
runs no function without Docker; serverless-offline runs functions but has no control plane. The
emulator is a front on one loopback port that sends ``Invoke`` to a serverless-offline serving that very
function (its code and settings as moto holds them: the zip the deployer uploaded, its environment,
memory and timeout; started on the first invocation, so that one is a cold start) and everything else to
moto. Deleting the function stops its serverless-offline.

``delay_s`` slows a function down, as a noisy neighbour or a platform's drift would: each invocation of a
function it names waits that many seconds before it is sent on.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
import time
import urllib.error
import urllib.request
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from tests.conftest import free_port
from tests.integration.serverless import serverless_offline

__all__ = ["LambdaEmulator"]

_INVOKE = re.compile(r"^/2015-03-31/functions/([^/]+)/invocations")
_FUNCTION = re.compile(r"^/2015-03-31/functions/([^/?]+)/?(?:\?.*)?$")
_PUBLISHED = re.compile(r"^/2015-03-31/functions(?:/[^/]+/versions)?/?$")  # CreateFunction, PublishVersion
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
        self._starting: dict[str, threading.Lock] = {}
        self.started: list[str] = []  # function names, in the order their serverless-offline started
        self.delay_s: dict[str, float] = {}  # function name -> seconds each of its invocations waits first
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
                    name, _, qualifier = unquote(m.group(1)).partition(":")
                    query = parse_qs(urlsplit(self.path).query)
                    base = emu._serving(name, qualifier or query.get("Qualifier", [""])[0] or None)
                    time.sleep(emu.delay_s.get(name, 0.0))
                status, headers, data = _forward(method, base + self.path, self.headers, body)
                d = _FUNCTION.match(self.path)
                if method == "DELETE" and d and status < 300:
                    emu._stop(unquote(d.group(1)))
                if method == "POST" and status < 300 and _PUBLISHED.match(urlsplit(self.path).path):
                    emu._start_soon(data)
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
        for name in {key.partition(":")[0] for key in list(self._offline)}:
            self._stop(name)
        self._moto.stop()

    @property
    def functions_running(self) -> list[str]:
        with self._lock:
            return sorted({key.partition(":")[0] for key in self._offline})

    def _start_soon(self, created: bytes) -> None:
        """Start serving a version just created or published, in the background. serverless-offline gives a
        Python function a 6 s context whatever its timeout, and a serverless-offline takes seconds to start:
        started on its first invocation, a worker would use up the master's time."""
        try:
            doc = json.loads(created)
            name, version = doc["FunctionName"], str(doc["Version"])
        except (ValueError, KeyError, TypeError):
            return
        if version != "$LATEST":
            threading.Thread(target=self._serve_quietly, args=(name, version), daemon=True).start()

    def _serve_quietly(self, name: str, version: str) -> None:
        with contextlib.suppress(Exception):  # deleted meanwhile: its first invocation would say so
            self._serving(name, version)

    def _serving(self, name: str, qualifier: str | None = None) -> str:
        """The Lambda port of the serverless-offline serving function ``name`` at ``qualifier`` (a version or
        an alias, as Lambda resolves it; None: $LATEST), started now if none serves that version: a version
        published later (a plan swapped in) runs its own code and settings beside the earlier one's."""
        from moto.awslambda.models import lambda_backends

        fn = lambda_backends[_ACCOUNT][self.region].get_function(name, qualifier)
        key = f"{name}:{fn.version}"
        # one start per version; invocations of the versions already serving never wait on it
        with self._lock:
            if key in self._offline:
                return self._offline[key][1]
            starting = self._starting.setdefault(key, threading.Lock())
        with starting:
            with self._lock:
                if key in self._offline:
                    return self._offline[key][1]
            stack = contextlib.ExitStack()
            with self._lock:
                out = self.root / f"{name}-{len(self.started)}"
                self.started.append(name)
            ports: dict[str, str] = {}

            def render(lambda_url: str) -> Path:
                ports["lambda"] = lambda_url
                return self._write_service(fn, out)

            stack.enter_context(serverless_offline(self.sls, render, out.with_suffix(".log"), [], http=False))
            with self._lock:
                self._offline[key] = (stack, ports["lambda"])
            return ports["lambda"]

    def _write_service(self, fn: object, out: Path) -> Path:
        """A one-function service of what moto holds for one version of a function: its package,
        environment, memory, timeout."""
        name: str = fn.function_name  # type: ignore[attr-defined]
        out.mkdir(parents=True)
        with zipfile.ZipFile(io.BytesIO(fn.code_bytes)) as z:  # type: ignore[attr-defined]
            z.extractall(out)
        doc = {
            "service": re.sub(r"[^A-Za-z0-9-]", "-", name),
            "frameworkVersion": "3",
            # the timeout at the provider too: serverless-offline's context counts the provider's (6 s by default)
            "provider": {"name": "aws", "runtime": fn.run_time, "region": self.region,  # type: ignore[attr-defined]
                         "timeout": int(fn.timeout)},  # type: ignore[attr-defined]
            "plugins": ["serverless-offline"],
            "functions": {"fn": {"name": name, "handler": fn.handler,  # type: ignore[attr-defined]
                                 "memorySize": int(fn.memory_size),  # type: ignore[attr-defined]
                                 "timeout": int(fn.timeout),  # type: ignore[attr-defined]
                                 "environment": dict(fn.environment_vars)}},  # type: ignore[attr-defined]
        }
        (out / "serverless.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return out

    def _stop(self, name: str) -> None:
        """Stop every version of function ``name`` that serves."""
        with self._lock:
            entries = [self._offline.pop(k) for k in list(self._offline) if k.partition(":")[0] == name]
        for entry in entries:
            entry[0].close()


def _forward(method: str, url: str, headers: object, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    hdrs = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}  # type: ignore[attr-defined]
    req = urllib.request.Request(url, data=body if method in ("POST", "PUT") else None, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return r.status, list(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        return e.code, list(e.headers.items()), e.read()
