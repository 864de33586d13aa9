"""`flatpack bench transport`: put+get throughput of each transport against a memcpy baseline.

For every tensor size (64 KB .. 64 MB, float32) and every transport, one round is ``put`` then ``get``
with delete-after-read (the path a worker's output takes to the master); the figure is bytes / median
round time. The baseline is ``np.copyto`` into a preallocated array of the same size, measured in the
same process and run. Rows:

* ``memcpy`` — the baseline.
* ``inline`` — the tensor codec into a binary event message and back (what rides inside an invocation).
* ``base64-json`` — Gillis's wire format: base64 of the raw bytes inside JSON, and back.
* ``shm`` — tmpfs files; the get is zero-copy (the array maps the file; pages are touched on use).
* ``redis`` — SET with a TTL, then GETDEL, on the server at ``--redis-url`` (skipped if none answers).
* ``s3`` — PUT, GET, DELETE on moto's server (``--s3``; a local stand-in, not AWS's speed).

Warm-up rounds are dropped; errors are counted, never swallowed.
"""

from __future__ import annotations

import base64
import json
import os
import platform as _platform
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import click
import numpy as np

__all__ = ["measure", "transport_cmd"]

SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)


def _time(fn: Callable[[], None], *, min_time_s: float, min_reps: int, max_reps: int, warmup: int = 2
          ) -> tuple[float, int, int]:
    """Median seconds of ``fn``, repetitions, errors."""
    errors = 0
    for _ in range(warmup):
        fn()
    times: list[float] = []
    t_end = time.perf_counter() + min_time_s
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001 - counted and reported, not swallowed
            errors += 1
            continue
        times.append(time.perf_counter() - t0)
    return (float(np.median(times)) if times else float("nan")), len(times), errors


def _round_trip(put: Callable[[str, np.ndarray], str], get: Callable[[str], np.ndarray], x: np.ndarray
                ) -> Callable[[], None]:
    def run() -> None:
        ref = put(uuid.uuid4().hex[:16], x)
        y = get(ref)
        if y.shape != x.shape:
            raise RuntimeError("round trip changed the shape")

    return run


def _inline(x: np.ndarray) -> Callable[[], None]:
    from functions.codec import decode, encode
    from functions.event import Event, TensorEntry

    def run() -> None:
        msg = Event("part", "r", "d", 0, (TensorEntry("x", data=encode(x)),), stage=0, part=0).encode("binary")
        y = decode(Event.decode(msg).inputs[0].data)  # type: ignore[arg-type]
        if y.shape != x.shape:
            raise RuntimeError("round trip changed the shape")

    return run


def _base64_json(x: np.ndarray) -> Callable[[], None]:
    def run() -> None:
        msg = json.dumps({"data": base64.b64encode(x.tobytes()).decode(), "shape": list(x.shape)})
        d = json.loads(msg)
        y = np.frombuffer(base64.b64decode(d["data"]), dtype=np.float32).reshape(d["shape"])
        if y.shape != x.shape:
            raise RuntimeError("round trip changed the shape")

    return run


@contextmanager
def _moto() -> Iterator[str]:
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    for k, v in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(k, v)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="flatpack-bench")
        yield url
    finally:
        server.stop()


def measure(sizes: tuple[int, ...] = SIZES, *, redis_url: str | None = "redis://127.0.0.1:6379/0",
            s3: bool = False, min_time_s: float = 0.3, max_reps: int = 200) -> dict[str, Any]:
    """Every row of the benchmark, and the skipped transports with the reason."""
    from functions.transport.base import TensorKey

    deployment = f"bench{uuid.uuid4().hex[:8]}"
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with ExitStack() as stack:
        stores: dict[str, Any] = {}
        from functions.transport.shm import ShmTransport

        shm = ShmTransport()
        stores["shm"] = shm
        stack.callback(shm.purge, deployment)
        if redis_url:
            from functions.errors import TransportError
            from functions.transport.redis import RedisTransport

            r = RedisTransport(redis_url)
            try:
                r.ping()
                stores["redis"] = r
                stack.callback(r.purge, deployment)
            except TransportError as e:
                skipped["redis"] = str(e)
        if s3:
            from functions.transport.s3 import S3Transport

            stores["s3"] = S3Transport("flatpack-bench", endpoint_url=stack.enter_context(_moto()))
        for size in sizes:
            x = np.random.default_rng(0).standard_normal(size // 4).astype(np.float32)
            dst = np.empty_like(x)
            fns: dict[str, Callable[[], None]] = {
                "memcpy": lambda x=x, dst=dst: np.copyto(dst, x),
                "inline": _inline(x),
                "base64-json": _base64_json(x),
            }
            for name, store in stores.items():
                fns[name] = _round_trip(
                    lambda k, a, store=store: store.put(TensorKey(deployment, "r", k), a),
                    lambda ref, store=store: store.get(ref, delete=True),
                    x,
                )
            base = None
            for name, fn in fns.items():
                reps_cap = max_reps if name != "s3" else 20
                med, reps, errors = _time(fn, min_time_s=min_time_s, min_reps=5, max_reps=reps_cap)
                mb_s = size / med / 1e6 if med == med and med > 0 else float("nan")
                if name == "memcpy":
                    base = mb_s
                rows.append({
                    "transport": name, "bytes": size, "median_ms": round(1e3 * med, 4), "mb_s": round(mb_s, 1),
                    "ratio_to_memcpy": round(mb_s / base, 4) if base else None, "reps": reps, "errors": errors,
                })
        for store in stores.values():
            store.close()
    return {"rows": rows, "skipped": skipped, "config": _config(sizes, redis_url, s3, min_time_s)}


def _config(sizes: tuple[int, ...], redis_url: str | None, s3: bool, min_time_s: float) -> dict[str, Any]:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,  # noqa: S607
                             cwd=Path(__file__).parent, check=False).stdout.strip() or None
    except OSError:
        rev = None
    return {"sizes": list(sizes), "redis_url": redis_url, "s3": s3, "min_time_s": min_time_s, "git_revision": rev,
            "cpus": os.cpu_count(), "machine": _platform.machine(), "python": _platform.python_version(),
            "numpy": np.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


@click.command("transport")
@click.option("--sizes", default=None, help="Comma-separated tensor sizes in KB (default 64..65536).")
@click.option("--redis-url", envvar="FLATPACK_REDIS_URL", default="redis://127.0.0.1:6379/0", show_default=True)
@click.option("--no-redis", is_flag=True, help="Leave Redis out.")
@click.option("--s3", is_flag=True, help="Include S3 (on moto's local server).")
@click.option("--min-time-s", type=float, default=0.3, show_default=True, help="Time spent per row, at least.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also save the JSON (with config and git revision) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def transport_cmd(sizes: str | None, redis_url: str, no_redis: bool, s3: bool, min_time_s: float, out: Path | None,
                  as_json: bool) -> None:
    """Put+get throughput of each transport (64 KB-64 MB) and its ratio to memcpy, measured in one run."""
    try:
        size_list = tuple(int(s) << 10 for s in sizes.split(",")) if sizes else SIZES
    except ValueError as e:
        raise click.BadParameter(f"{sizes!r}: give sizes in KB, e.g. 64,4096") from e
    result = measure(size_list, redis_url=None if no_redis else redis_url, s3=s3, min_time_s=min_time_s)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    if as_json:
        click.echo(json.dumps(result))
        return
    from rich.table import Table

    from serving.cli.console import console

    t = Table(title="transport put+get throughput (MB/s = 1e6 bytes/s; ratio to memcpy in the same run)")
    names = list(dict.fromkeys(r["transport"] for r in result["rows"]))
    t.add_column("size", justify="right")
    for n in names:
        t.add_column(n, justify="right")
    for size in dict.fromkeys(r["bytes"] for r in result["rows"]):
        cells = []
        for n in names:
            r = next(r for r in result["rows"] if r["transport"] == n and r["bytes"] == size)
            cell = f"{r['mb_s']:.0f}" if n == "memcpy" else f"{r['mb_s']:.0f} ({r['ratio_to_memcpy']:.2f}x)"
            cells.append(cell + (f" [{r['errors']} err]" if r["errors"] else ""))
        t.add_row(_size(size), *cells)
    console.print(t)
    for name, why in result["skipped"].items():
        console.print(f"[yellow]skipped {name}[/]: {why}")
