"""`flatpack bench endpoint`: HTTP inference latency against onnxruntime in-process, in one run.

For an unsplit small model: p50/p99 of onnxruntime in this process (the baseline), of the endpoint
running the model in its own process (``serve --in-process``: HTTP + protocol cost only), and of the
endpoint in front of a deployment on the local platform (HTTP + invoke of the master function);
requests/s with 8 concurrent clients. Every response is checked against the baseline's output.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import click
import numpy as np
from rich.table import Table

from serving.cli.console import console, err_console

__all__ = ["endpoint_cmd"]


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p)) if xs else float("nan")


def _timed(fn, n: int, warmup: int) -> list[float]:  # type: ignore[no-untyped-def]
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def _throughput(fn, clients: int, seconds: float) -> tuple[float, int]:  # type: ignore[no-untyped-def]
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


@click.command("endpoint")
@click.option("--json", "as_json", is_flag=True)
@click.option("--requests", "n", default=200, show_default=True)
@click.option("--model", default="resnet18", show_default=True, help="Zoo model (small variant).")
def endpoint_cmd(as_json: bool, n: int, model: str) -> None:
    """Endpoint overhead vs onnxruntime in-process (target: p50 <= 1.10x + 2 ms) and requests/s."""
    from bench.zoo import build_to_file
    from functions.session import make_session
    from partitioner.export import export_bundle
    from serving.api import DataPlane, InProcessBackend, create_app
    from serving.api.client import infer_http
    from serving.api.server import AppServer
    from serving.deploy.local import PlatformBackend
    from serving.platform.config import PlatformConfig
    from serving.platform.deploy import deploy_bundle
    from serving.platform.server import LocalPlatform

    threads = min(2, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-") as tmp:
        path = build_to_file(model, Path(tmp) / "m.onnx", width_div=2, input_size=64)
        bundle = export_bundle(path, "0-:none", Path(tmp) / "b")
        sess = make_session(path, intra_op_threads=threads)
        x = {i.name: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}
        want = sess.run(None, x)[0]
        wrong = [0]

        def check(out: dict) -> None:
            got = next(iter(out.values()))
            if np.abs(got - want).max() > 1e-4 * max(1.0, float(np.abs(want).max())):
                wrong[0] += 1

        rows = {}
        err_console.print("[dim]onnxruntime in-process[/]")
        rows["onnxruntime"] = _timed(lambda: sess.run(None, x), n, 20)
        plane = DataPlane()
        plane.add(InProcessBackend(bundle, name="m"))
        with AppServer(create_app(plane, token="")) as s:
            err_console.print("[dim]endpoint, model in the endpoint's process[/]")
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
                    err_console.print("[dim]endpoint in front of the local platform[/]")
                    rows["endpoint_platform"] = _timed(lambda: check(infer_http(s2.url, "m", x)), n, 20)
                    rps_pf, err_pf = _throughput(lambda: check(infer_http(s2.url, "m", x)), 8, 5.0)
            finally:
                dep.remove()
    base = statistics.median(rows["onnxruntime"])
    result = {
        "model": f"{model} (width/2, 64x64)",
        "threads": threads,
        "machine": {"cores": os.cpu_count()},
        "latency_ms": {k: {"p50": _pct(v, 50), "p99": _pct(v, 99)} for k, v in rows.items()},
        "overhead": {
            k: {"ratio_p50": _pct(v, 50) / base, "extra_ms_p50": _pct(v, 50) - base,
                "within_target": _pct(v, 50) <= 1.10 * base + 2.0}
            for k, v in rows.items() if k != "onnxruntime"
        },
        "requests_per_s_8_clients": {"endpoint_in_process": rps_in, "endpoint_platform": rps_pf},
        "errors": err_in + err_pf,
        "wrong_outputs": wrong[0],
    }
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    table = Table(title=f"endpoint overhead, {result['model']}")
    for col in ("path", "p50 ms", "p99 ms", "x onnxruntime", "+ms"):
        table.add_column(col)
    for k, v in rows.items():
        table.add_row(k, f"{_pct(v, 50):.2f}", f"{_pct(v, 99):.2f}", f"{_pct(v, 50) / base:.2f}",
                      f"{_pct(v, 50) - base:.2f}")
    console.print(table)
    console.print(f"requests/s at 8 clients: {result['requests_per_s_8_clients']}; errors {result['errors']}, "
                  f"wrong outputs {result['wrong_outputs']}")
