"""Put+get throughput of each transport against a memcpy baseline (``flatpack bench transport``).

For every tensor size (64 KB .. 64 MB, float32) and every transport, one round is ``put`` then ``get``
with delete-after-read (the path a worker's output takes to the master); the figure is bytes / median
round time. The baseline is ``np.copyto`` into a preallocated array of the same size, measured in the
same process and run. Rows:

* ``memcpy`` — the baseline.
* ``inline`` — the tensor codec into a binary event message and back (what rides inside an invocation).
* ``base64-json`` — Gillis's wire format: base64 of the raw bytes inside JSON, and back.
* ``shm`` — tmpfs files; the get is zero-copy (the array maps the file; pages are touched on use).
* ``redis`` — SET with a TTL, then GETDEL, on the server at ``redis_url`` (skipped if none answers).
* ``s3`` — PUT, GET, DELETE on moto's server (``s3=True``; a local stand-in, not AWS's speed).

Warm-up rounds are dropped; errors are counted, never swallowed.
"""

from __future__ import annotations

import base64
import json
import os
import platform as _platform
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.harness.provenance import git_revision
from bench.harness.redis_server import free_port

if TYPE_CHECKING:  # the transports are imported when a run starts
    from functions.transport.base import Transport

__all__ = ["SIZES", "TransportResult", "TransportRow", "measure"]

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


def _memcpy(x: np.ndarray) -> Callable[[], None]:
    dst = np.empty_like(x)

    def run() -> None:
        np.copyto(dst, x)

    return run


def _round_trip(store: Transport, deployment: str, x: np.ndarray) -> Callable[[], None]:
    """``put`` then ``get`` with delete-after-read."""
    from functions.transport.base import TensorKey

    def run() -> None:
        ref = store.put(TensorKey(deployment, "r", uuid.uuid4().hex[:16]), x)
        y = store.get(ref, delete=True)
        if y.shape != x.shape:
            raise RuntimeError("round trip changed the shape")

    return run


def _inline(x: np.ndarray) -> Callable[[], None]:
    from functions.codec import decode, encode
    from functions.event import Event, TensorEntry

    def run() -> None:
        msg = Event("part", "r", "d", 0, (TensorEntry("x", data=encode(x)),), stage=0, part=0).encode("binary")
        data = Event.decode(msg).inputs[0].data
        if data is None:
            raise RuntimeError("the tensor came back as a reference, not inline")
        y = decode(data)
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
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="flatpack-bench")
        yield url
    finally:
        server.stop()


@dataclass(frozen=True)
class TransportRow:
    """One transport at one tensor size: the median round (ms), its throughput (MB/s = 1e6 bytes/s), that
    over memcpy's at the same size (None for memcpy's own row before it is known), reps and errors."""

    transport: str
    bytes: int
    median_ms: float
    mb_s: float
    ratio_to_memcpy: float | None
    reps: int
    errors: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TransportResult:
    """Every row, the transports skipped (with the reason), and the run's configuration and provenance."""

    rows: tuple[TransportRow, ...]
    skipped: Mapping[str, str]
    config: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"rows": [r.to_json() for r in self.rows], "skipped": dict(self.skipped), "config": dict(self.config)}


def measure(sizes: tuple[int, ...] = SIZES, *, redis_url: str | None = "redis://127.0.0.1:6379/0",
            s3: bool = False, min_time_s: float = 0.3, max_reps: int = 200) -> TransportResult:
    """Every row of the benchmark, and the skipped transports with the reason."""
    deployment = f"bench{uuid.uuid4().hex[:8]}"
    rows: list[TransportRow] = []
    skipped: dict[str, str] = {}
    with ExitStack() as stack:
        stores: dict[str, Transport] = {}
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
            fns: dict[str, Callable[[], None]] = {
                "memcpy": _memcpy(x),
                "inline": _inline(x),
                "base64-json": _base64_json(x),
            }
            for name, store in stores.items():
                fns[name] = _round_trip(store, deployment, x)
            base = None
            for name, fn in fns.items():
                reps_cap = max_reps if name != "s3" else 20
                med, reps, errors = _time(fn, min_time_s=min_time_s, min_reps=5, max_reps=reps_cap)
                mb_s = size / med / 1e6 if med == med and med > 0 else float("nan")
                if name == "memcpy":
                    base = mb_s
                rows.append(TransportRow(name, size, round(1e3 * med, 4), round(mb_s, 1),
                                         round(mb_s / base, 4) if base else None, reps, errors))
        for store in stores.values():
            store.close()
    return TransportResult(tuple(rows), skipped, _config(sizes, redis_url, s3, min_time_s))


def _config(sizes: tuple[int, ...], redis_url: str | None, s3: bool, min_time_s: float) -> dict[str, Any]:
    return {"sizes": list(sizes), "redis_url": redis_url, "s3": s3, "min_time_s": min_time_s,
            "git_revision": git_revision() or None,
            "cpus": os.cpu_count(), "machine": _platform.machine(), "python": _platform.python_version(),
            "numpy": np.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
