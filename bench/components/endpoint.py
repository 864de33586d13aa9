"""HTTP inference latency against onnxruntime in-process, in one run (``flatpack bench endpoint``).

For an unsplit small model: p50/p99 of onnxruntime in this process (the baseline), of the endpoint
running the model in its own process (``serve --in-process``: HTTP + protocol cost only), and of the
endpoint in front of a deployment on the local platform (HTTP + invoke of the master function);
requests/s with 8 concurrent clients. Every response is checked against the baseline's output.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PATHS", "EndpointResult", "measure_endpoint"]

# the paths timed: the baseline first
PATHS = ("onnxruntime", "endpoint_in_process", "endpoint_platform")


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p)) if xs else float("nan")


def _timed(fn: Callable[[], Any], n: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def _throughput(fn: Callable[[], Any], clients: int, seconds: float) -> tuple[float, int]:
    stop = time.perf_counter() + seconds
    counts = [0] * clients
    errors = [0]

    def loop(i: int) -> None:
        while time.perf_counter() < stop:
            try:
                fn()
                counts[i] += 1
            except Exception:  # noqa: BLE001 - counted, never dropped silently
                errors[0] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0), errors[0]


@dataclass(frozen=True)
class EndpointResult:
    """Every path's latencies (ms, warm-up dropped; :data:`PATHS`, onnxruntime in this process the
    baseline), requests/s of each endpoint path with 8 concurrent clients, failed requests, and responses
    whose output differed from the baseline's."""

    model: str
    threads: int
    latency_ms: Mapping[str, list[float]]
    requests_per_s: Mapping[str, float]
    errors: int
    wrong_outputs: int

    @property
    def baseline_p50_ms(self) -> float:
        return statistics.median(self.latency_ms["onnxruntime"])

    def p50(self, path: str) -> float:
        return _pct(list(self.latency_ms[path]), 50)

    def p99(self, path: str) -> float:
        return _pct(list(self.latency_ms[path]), 99)

    def to_json(self) -> dict[str, Any]:
        base = self.baseline_p50_ms
        return {
            "model": self.model,
            "threads": self.threads,
            "machine": {"cores": os.cpu_count()},
            "latency_ms": {k: {"p50": self.p50(k), "p99": self.p99(k)} for k in self.latency_ms},
            "overhead": {
                k: {"ratio_p50": self.p50(k) / base, "extra_ms_p50": self.p50(k) - base,
                    "within_target": self.p50(k) <= 1.10 * base + 2.0}
                for k in self.latency_ms if k != "onnxruntime"
            },
            "requests_per_s_8_clients": dict(self.requests_per_s),
            "errors": self.errors,
            "wrong_outputs": self.wrong_outputs,
        }


def measure_endpoint(*, n: int = 200, model: str = "resnet18", say: Callable[[str], None] | None = None
                     ) -> EndpointResult:
    """``n`` timed requests on each path for zoo ``model`` (width / 2, 64 x 64, unsplit), and 5 s of 8
    concurrent clients on each endpoint path."""
    from functions.session import make_session
    from partitioner.export import export_bundle
    from serving.api import DataPlane, InProcessBackend, create_app
    from serving.api.client import infer_http
    from serving.api.server import AppServer
    from serving.deploy.local import PlatformBackend
    from serving.platform.config import PlatformConfig
    from serving.platform.deploy import deploy_bundle
    from serving.platform.server import LocalPlatform
    from zoo import build_to_file

    say = say or (lambda _m: None)
    threads = min(2, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-") as tmp:
        path = build_to_file(model, Path(tmp) / "m.onnx", width_div=2, input_size=64)
        bundle = export_bundle(path, "0-:none", Path(tmp) / "b")
        sess = make_session(path, intra_op_threads=threads)
        x = {i.name: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}
        want = sess.run(None, x)[0]
        wrong = [0]

        def check(out: dict[str, np.ndarray]) -> None:
            got = next(iter(out.values()))
            if np.abs(got - want).max() > 1e-4 * max(1.0, float(np.abs(want).max())):
                wrong[0] += 1

        rows: dict[str, list[float]] = {}
        say("onnxruntime in-process")
        rows["onnxruntime"] = _timed(lambda: sess.run(None, x), n, 20)
        plane = DataPlane()
        plane.add(InProcessBackend(bundle, name="m"))
        with AppServer(create_app(plane, token="")) as s:
            say("endpoint, model in the endpoint's process")
            rows["endpoint_in_process"] = _timed(lambda: check(infer_http(s.url, "m", x)), n, 20)
            rps_in, err_in = _throughput(lambda: check(infer_http(s.url, "m", x)), 8, 5.0)
        with LocalPlatform(PlatformConfig.from_env(port=0)) as local:
            dep = deploy_bundle(local.client, bundle, transport="shm")
            backend = PlatformBackend(dep, local.url, name="m")
            backend.warm_up(x)
            plane2 = DataPlane()
            plane2.add(backend)
            try:
                with AppServer(create_app(plane2, token="")) as s2:
                    say("endpoint in front of the local platform")
                    rows["endpoint_platform"] = _timed(lambda: check(infer_http(s2.url, "m", x)), n, 20)
                    rps_pf, err_pf = _throughput(lambda: check(infer_http(s2.url, "m", x)), 8, 5.0)
            finally:
                dep.remove()
    return EndpointResult(f"{model} (width/2, 64x64)", threads, rows,
                          {"endpoint_in_process": rps_in, "endpoint_platform": rps_pf}, err_in + err_pf, wrong[0])
