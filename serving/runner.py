"""Running a bundle on the local platform and checking it: what ``flatpack run`` does.

Deploys the bundle's functions, sends requests with seeded random inputs from several client threads,
checks every output against onnxruntime on the unsplit model (``source.onnx``), reads the billing
meter, and optionally measures fork-join overhead: a one-part bundle of the same model through the
platform against onnxruntime in this process, both sequential, same thread count. Everything it
started is torn down, and what the requests left in the transports is counted (it should be nothing).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from functions.bundle import MANIFEST_SCHEMA, sha256_file
from functions.compare import DEFAULT_TOLERANCE, rel_err
from functions.errors import FunctionError, TransportError
from functions.plan import Function, Part, PartInput, Plan, Split, Stage, full_region
from functions.session import make_session
from serving.platform.config import PlatformConfig
from serving.platform.deploy import ConfigOverrides, Deployment, deploy_bundle, new_deployment_id
from serving.platform.master_client import MasterClient
from serving.platform.server import LocalPlatform

__all__ = ["RunReport", "one_part_bundle", "run_bundle"]

log = logging.getLogger(__name__)


@dataclass
class RunReport:
    bundle: str
    transport: str
    requests: int
    correct: int
    errors: int
    max_rel_err: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    throughput_rps: float
    billed_gb_s: float
    cold_starts: int
    invocations: int
    leftover_tensors: int
    inprocess_p50_ms: float | None = None
    one_part_p50_ms: float | None = None
    overhead_ratio: float | None = None
    split_vs_inprocess: float | None = None
    first_error: str | None = None
    functions: dict[str, Any] = field(default_factory=dict)
    backend: str = "onnxruntime"

    @property
    def ok(self) -> bool:
        return self.correct == self.requests and self.leftover_tensors == 0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        # six significant digits: a relative error of 2e-8 must not print as 0.0
        return {k: (float(f"{v:.6g}") if isinstance(v, float) and np.isfinite(v) else v) for k, v in d.items()}


def _percentile(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p)) if xs else float("nan")


def _random_inputs_fn(source: Path) -> Callable[[int], dict[str, np.ndarray]]:
    import onnx

    from partitioner.inputs import random_inputs

    model = onnx.load(str(source), load_external_data=False)
    return lambda seed: random_inputs(model, seed)


def one_part_bundle(bundle_dir: Path, out: Path) -> Path:
    """A bundle of the whole unsplit model as one part run by the master (the fork-join baseline)."""
    plan = Plan.load(bundle_dir / "plan.json")
    (out / "parts").mkdir(parents=True, exist_ok=True)
    src = (bundle_dir / "source.onnx").resolve()
    for name in ("source.onnx", "parts/whole.onnx"):
        link = out / name
        if not link.exists():
            link.symlink_to(src)
    part = Part(0, plan.master, "parts/whole.onnx",
                tuple(PartInput(t.name, full_region(t.shape)) for t in plan.model.inputs),
                tuple(t.name for t in plan.model.outputs))
    last = max((s.units[1] for s in plan.stages), default=0)
    stage = Stage(0, (0, last), Split(), tuple(t.name for t in plan.model.inputs), plan.model.outputs, (part,))
    one = Plan(plan.model, (Function(plan.master, plan.function(plan.master).memory_mb),), (stage,),
               platform=plan.platform, transport=plan.transport, mode="one-part")
    one.save(out / "plan.json")
    # a manifest as export writes one: the local platform takes in only bundles whose files match theirs
    files = {rel: sha256_file(out / rel) for rel in ("plan.json", "source.onnx", "parts/whole.onnx")}
    manifest = {"schema": MANIFEST_SCHEMA, "source": {"file": None, "sha256": files["source.onnx"]}, "files": files}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return out


@contextmanager
def _s3_endpoint(url: str | None, bucket: str) -> Iterator[str]:
    """The given S3 endpoint, or moto's server on a loopback port for the length of the run."""
    if url:
        yield url
        return
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        raise TransportError(
            "--transport s3 without --s3-endpoint-url needs moto to stand in for S3 locally: "
            "pip install 'flatpack[dev]', or pass --s3-endpoint-url"
        ) from e
    for k, v in (("AWS_ACCESS_KEY_ID", "local"), ("AWS_SECRET_ACCESS_KEY", "local"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(k, v)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request at INFO
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()


def _check_store(transport: str, cfg: ConfigOverrides) -> None:
    if transport == "redis":
        from functions.transport.redis import RedisTransport

        t = RedisTransport(str(cfg.get("redis_url") or "redis://127.0.0.1:6379/0"))
        try:
            t.ping()
        finally:
            t.close()


def run_bundle(
    bundle_dir: str | Path,
    *,
    transport: str = "shm",
    requests: int = 20,
    concurrency: int = 1,
    seed: int = 0,
    max_instances: int | None = None,
    timeout_s: float = 60.0,
    tolerance: float = DEFAULT_TOLERANCE,
    overhead: bool = True,
    overhead_requests: int = 20,
    redis_url: str | None = None,
    s3_endpoint_url: str | None = None,
    s3_bucket: str = "flatpack-tensors",
    platform: PlatformConfig | None = None,
    progress: Callable[[int], None] | None = None,
    backend: str = "onnxruntime",
) -> RunReport:
    """Deploy, load, check and tear down; see the module docstring. Raises FunctionError for setup failures
    (an unreachable Redis, say); request failures are counted in the report, not raised.

    ``backend`` runs the bundle's parts with ``onnxruntime`` or ``mxnet`` (the reference outputs, and the
    one-part overhead baseline, stay onnxruntime in this process)."""
    bundle_dir = Path(bundle_dir).resolve()
    plan = Plan.load(bundle_dir / "plan.json")
    source = bundle_dir / "source.onnx"
    make_inputs = _random_inputs_fn(source)
    inputs = [make_inputs(seed + i) for i in range(requests)]
    ref = make_session(source)
    out_names = [o.name for o in ref.get_outputs()]
    expected = [dict(zip(out_names, ref.run(out_names, x), strict=True)) for x in inputs]

    cfg: ConfigOverrides = {}
    if redis_url:
        cfg["redis_url"] = redis_url
    with ExitStack() as stack:
        if transport == "s3":
            cfg["s3_endpoint_url"] = stack.enter_context(_s3_endpoint(s3_endpoint_url, s3_bucket))
            cfg["s3_bucket"] = s3_bucket
        _check_store(transport, cfg)
        pcfg = platform or PlatformConfig.from_env(port=0)
        cfg.setdefault("shm_dir", pcfg.shm_dir)
        local = stack.enter_context(LocalPlatform(pcfg))
        client = local.client
        dep = deploy_bundle(client, bundle_dir, transport=transport, deployment=new_deployment_id("run"),
                            concurrency=max_instances or concurrency, timeout_s=timeout_s, backend=backend, **cfg)
        try:
            lat, errs, first_error, max_err, correct = _load(dep, local.url, inputs, expected, concurrency,
                                                              timeout_s, tolerance, progress)
            wall = lat.pop()
            leftovers = dep.leftovers()
        finally:
            dep.remove()
        meter = client.meter()["functions"]
        mine = {k: v for k, v in meter.items() if k in dep.names.values()}
        report = RunReport(
            bundle=str(bundle_dir), transport=transport, requests=requests, correct=correct, errors=errs,
            max_rel_err=max_err, p50_ms=_percentile(lat, 50), p99_ms=_percentile(lat, 99),
            mean_ms=statistics.fmean(lat) if lat else float("nan"),
            throughput_rps=requests / wall if wall > 0 else float("nan"),
            billed_gb_s=sum(v["billed_gb_s"] for v in mine.values()),
            cold_starts=sum(v["cold_starts"] for v in mine.values()),
            invocations=sum(v["invocations"] for v in mine.values()),
            leftover_tensors=sum(leftovers.values()), first_error=first_error,
            functions={k.removeprefix(f"{dep.id}-"): v for k, v in mine.items()}, backend=backend,
        )
        if overhead and requests:
            _overhead(report, local, bundle_dir, plan, inputs, transport, cfg, timeout_s, overhead_requests)
    return report


def _load(dep: Deployment, url: str, inputs: list[dict[str, np.ndarray]], expected: list[dict[str, np.ndarray]],
          concurrency: int, timeout_s: float, tolerance: float, progress: Callable[[int], None] | None
          ) -> tuple[list[float], int, str | None, float, int]:
    client = MasterClient(dep, url, timeout_s=timeout_s)
    lat: list[float] = []
    errs = 0
    first_error: str | None = None
    max_err = 0.0
    correct = 0
    lock = threading.Lock()

    def one(i: int) -> None:
        nonlocal errs, first_error, max_err, correct
        t0 = time.perf_counter()
        try:
            got = client.infer(inputs[i])
        except FunctionError as e:
            with lock:
                errs += 1
                first_error = first_error or str(e)
            return
        finally:
            if progress:
                progress(1)
        dt = 1e3 * (time.perf_counter() - t0)
        err = max((rel_err(got.get(k, np.empty(0)), v) for k, v in expected[i].items()), default=0.0)
        with lock:
            lat.append(dt)
            max_err = max(max_err, err)
            correct += int(err <= tolerance)

    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="flatpack-client") as pool:
            list(pool.map(one, range(len(inputs))))
    finally:
        client.close()
    lat.append(time.perf_counter() - t0)  # wall time, popped by the caller
    return lat, errs, first_error, max_err, correct


def _overhead(report: RunReport, local: LocalPlatform, bundle_dir: Path, plan: Plan,
              inputs: list[dict[str, np.ndarray]], transport: str, cfg: ConfigOverrides, timeout_s: float,
              n: int) -> None:
    """Fork-join overhead: the unsplit model as a one-part bundle through the platform vs in-process."""
    memory = plan.function(plan.master).memory_mb
    threads = local.service.profile.threads(memory)
    sess = make_session(bundle_dir / "source.onnx", intra_op_threads=threads)
    names = [o.name for o in sess.get_outputs()]
    xs = [inputs[i % len(inputs)] for i in range(n + 1)]
    t_in = []
    for x in xs:
        t0 = time.perf_counter()
        sess.run(names, x)
        t_in.append(1e3 * (time.perf_counter() - t0))
    with tempfile.TemporaryDirectory(prefix="flatpack-one-part-") as tmp:
        one = one_part_bundle(bundle_dir, Path(tmp))
        dep = deploy_bundle(local.client, one, transport=transport, deployment=new_deployment_id("one"),
                            concurrency=1, timeout_s=timeout_s, **cfg)
        client = MasterClient(dep, local.url, timeout_s=timeout_s)
        t_one = []
        try:
            for x in xs:
                t0 = time.perf_counter()
                client.infer(x)
                t_one.append(1e3 * (time.perf_counter() - t0))
        except FunctionError as e:
            log.warning("one-part baseline failed: %s", e)
            return
        finally:
            client.close()
            dep.remove()
    # the first of each is a warm-up (the one-part one is a cold start)
    report.inprocess_p50_ms = _percentile(t_in[1:], 50)
    report.one_part_p50_ms = _percentile(t_one[1:], 50)
    report.overhead_ratio = report.one_part_p50_ms / report.inprocess_p50_ms
    report.split_vs_inprocess = report.p50_ms / report.inprocess_p50_ms


def report_json(report: RunReport) -> str:
    return json.dumps(report.to_json(), indent=1)
