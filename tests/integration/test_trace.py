"""Request traces end to end: a split plan served on the local platform (real processes, real HTTP),
`flatpack trace NAME --last 1 --json` and its PNG, and the spans arriving at an OpenTelemetry collector
(a real HTTP server on a loopback port standing in for one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from functions.trace import CONTAINERS, Span, union_ms
from serving.api.client import infer_http

pytest.importorskip("opentelemetry.sdk")


def flatpack(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's one route: POST /v1/traces, bodies kept."""

    bodies: list[bytes]
    paths: list[str]

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        self.server.bodies.append(body)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def collector() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    server.bodies = []  # type: ignore[attr-defined]
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def served(bundles, collector: ThreadingHTTPServer, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[dict[str, str], dict]]:
    """The conv_channel bundle (one stage, two parts on two workers) served as deployment ``tr``."""
    state = tmp_path_factory.mktemp("trace-state")
    env = os.environ.copy()
    env["FLATPACK_STATE_DIR"] = str(state)
    env.pop("FLATPACK_API_TOKEN", None)
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{collector.server_address[1]}"
    res = flatpack("serve", str(bundles.conv_channel), "--name", "tr", "--detach", "--port", "0", env=env)
    assert res.returncode == 0, res.stderr + res.stdout
    record = json.loads((state / "deployments" / "tr.json").read_text())
    try:
        yield env, record
    finally:
        flatpack("undeploy", "tr", env=env)


def _request(record: dict) -> None:
    x = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    assert infer_http(record["endpoint"], "tr", x)["y"].shape == (1, 8, 8, 8)


def test_trace_json_covers_the_request(served: tuple[dict[str, str], dict], tmp_path: Path) -> None:
    env, record = served
    _request(record)
    png = tmp_path / "waterfall.png"
    res = flatpack("trace", "tr", "--last", "1", "--json", "--png", str(png), env=env)
    assert res.returncode == 0, res.stderr + res.stdout
    doc = json.loads(res.stdout)
    assert len(doc["requests"]) == 1
    req = doc["requests"][0]
    latency = req["latency_ms"]
    spans = [Span(s["name"], s["stage"], s["part"], s["start_ms"], s["end_ms"]) for s in req["spans"]]
    assert all(0 <= s.start_ms <= s.end_ms <= latency * 1.0001 for s in spans), spans
    assert abs(union_ms(spans) - latency) <= 0.05 * latency
    # the spans below the frames (request, master, stage) cover it too, bar the hand-offs between threads
    leaves = [s for s in spans if s.name not in CONTAINERS]
    assert union_ms(leaves) >= 0.5 * latency
    names = {(s.name, s.stage, s.part) for s in spans}
    for part in (0, 1):
        for step in ("scatter", "invoke", "read", "compute", "write", "reply", "gather"):
            assert (step, 0, part) in names, (step, part, sorted(names, key=str))
    assert {("stage", 0, None), ("join", 0, None), ("decode", None, None), ("encode", None, None),
            ("master", None, None), ("send", None, None), ("return", None, None)} <= names
    # each part's steps follow each other in the master's timeline
    for part in (0, 1):
        step = {s.name: s for s in spans if s.stage == 0 and s.part == part}
        order = ["invoke", "read", "compute", "write", "reply", "gather"]
        for a, b in zip(order, order[1:], strict=False):
            assert step[a].end_ms <= step[b].start_ms + 1e-3, (a, b, step)
    b = req["breakdown"]
    assert abs(sum(b.values()) - latency) <= 0.01 * latency + 0.01
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the text waterfall
    res = flatpack("trace", "tr", env=env)
    assert res.returncode == 0, res.stderr
    assert "s0 p1 compute" in res.stdout and "compute" in res.stdout


def test_trace_spans_reach_an_otlp_collector(served: tuple[dict[str, str], dict],
                                             collector: ThreadingHTTPServer) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    _, record = served
    _request(record)
    deadline = time.monotonic() + 30
    names: set[tuple[str, int | None]] = set()
    while time.monotonic() < deadline:
        names = set()
        for body in list(collector.bodies):  # type: ignore[attr-defined]
            msg = ExportTraceServiceRequest()
            msg.ParseFromString(body)
            for rs in msg.resource_spans:
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        attrs = {a.key: a.value.int_value for a in sp.attributes if a.key == "flatpack.part"}
                        names.add((sp.name, attrs.get("flatpack.part")))
        if {("request", None), ("compute", 0), ("compute", 1), ("invoke", 1), ("stage", None)} <= names:
            break
        time.sleep(0.1)
    assert {("request", None), ("compute", 0), ("compute", 1), ("invoke", 1), ("stage", None)} <= names, names
    assert set(collector.paths) == {"/v1/traces"}  # type: ignore[attr-defined]


def test_trace_of_an_unknown_deployment_says_so(tmp_path: Path) -> None:
    env = os.environ.copy()
    env["FLATPACK_STATE_DIR"] = str(tmp_path / "state")
    res = flatpack("trace", "nope", env=env)
    assert res.returncode != 0 and "no deployment named 'nope'" in res.stderr
