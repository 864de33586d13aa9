"""The service profiler: measured time and memory of every unit and of the parts of split options.

Every model (a unit's stage model, or one part of a split option) is measured with onnxruntime in a
fresh process (:mod:`partitioner.measure_worker`) sized like the function that would run it: intra-op
threads from its vCPU share, one inter-op thread. The process reports warm-up-free run times (median and
p95 over ``reps`` runs after ``warmup`` runs), its peak resident memory (VmHWM: interpreter, numpy,
onnxruntime, inputs, weights and whatever onnxruntime allocates - measured, never summed from tensor
sizes), and the parent times its cold start (spawn to session ready: interpreter start, imports,
session creation).

Results are cached on disk as JSON (never pickle), keyed by the measured content (model sha256 plus
unit or part), thread count, repetitions, onnxruntime version and a machine fingerprint, so a second
profile of the same model measures nothing. Under a time budget the units that matter most (their share
of the model's FLOPs plus their share of its weights) are measured first and the rest is predicted
(``partitioner.predictors``) and marked ``measured=False``.

Thread counts above this machine's cores are not measured (the numbers would be a lie); they are
listed in ``GraphProfile.skipped_threads`` and left to the performance model to extrapolate.

Limits: timings are taken one process at a time (parallel measurements would disturb each other), but
anything else running on the machine still does; Linux-only peak memory (0 elsewhere).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Literal, TypeAlias, overload

import numpy as np
import onnx
from onnx import TensorProto, helper

from functions.plan import Split
from partitioner.errors import NotSplittable
from partitioner.graph import LayerGraph
from partitioner.inputs import random_inputs
from partitioner.parts import CutStage

__all__ = [
    "CACHE_DIR_ENV",
    "GraphProfile",
    "MeasureError",
    "Measurement",
    "ModelSource",
    "OptionKey",
    "ProfileCache",
    "ProgressFn",
    "UnitProfile",
    "default_cache_dir",
    "machine_info",
    "measure_many",
    "measure_model",
    "model_sha256",
    "profile_graph",
    "profile_options",
    "runtime_base_mb",
]

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "FLATPACK_CACHE_DIR"
# Bump when what a measurement means changes (worker protocol, input generation): old entries are ignored.
FORMAT_VERSION = 1
_REPO_ROOT = Path(__file__).resolve().parents[1]

ModelSource: TypeAlias = "onnx.ModelProto | Path | Callable[[], onnx.ModelProto | Path]"
"""A model to measure: a ModelProto, a file, or a zero-argument callable building one (called only
when the measurement is not cached)."""
ProgressFn: TypeAlias = Callable[[int, int, str], None]
"""Called as ``progress(done, total, label)`` after each measurement (cache hits included)."""
Isolation: TypeAlias = Literal["fork", "spawn"]
OptionKey: TypeAlias = tuple[int, int, str, int]
"""(first unit, last unit, str(split), part index)."""


class MeasureError(RuntimeError):
    """A measuring process failed (the model does not run, the process died, or it timed out)."""


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One model measured at one thread count in its own process.

    ``median_ms``/``p95_ms``: per-run latency after warm-up. ``peak_rss_mb``: the process's peak
    resident memory (MB = 2**20 bytes) while creating the session and running it. ``cold_start_ms``:
    process spawn to session ready. ``session_ms``: the session-creation part of it.
    """

    median_ms: float
    p95_ms: float
    peak_rss_mb: float
    cold_start_ms: float
    threads: int
    reps: int
    session_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Measurement:
        return cls(
            median_ms=float(d["median_ms"]),
            p95_ms=float(d["p95_ms"]),
            peak_rss_mb=float(d["peak_rss_mb"]),
            cold_start_ms=float(d["cold_start_ms"]),
            threads=int(d["threads"]),
            reps=int(d["reps"]),
            session_ms=float(d.get("session_ms", 0.0)),
        )


@cache
def machine_info() -> dict[str, Any]:
    """What measurements depend on: CPU, cores, onnxruntime and Python versions, and an ``id`` hashing them
    with the machine id (so a cache copied to another machine is not mistaken for this one's)."""
    import onnxruntime as ort

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    mid = ""
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError):
            mid = Path(p).read_text().strip()
            break
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count() or 1,
        "onnxruntime": ort.__version__,
        "python": platform.python_version(),
        "system": platform.system(),
    }
    raw = json.dumps({**info, "machine_id": mid or platform.node(), "format": FORMAT_VERSION}, sort_keys=True)
    info["id"] = hashlib.sha256(raw.encode()).hexdigest()[:16]
    return info


def model_sha256(model: onnx.ModelProto) -> str:
    """A content hash of a model: graph structure, opsets and every initializer's bytes.

    Hashes piece by piece, so it works for models above protobuf's 2 GB serialisation limit.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected onnx.ModelProto, got {type(model).__name__}")
    h = hashlib.sha256()
    for o in model.opset_import:
        h.update(o.SerializeToString())
    g = model.graph
    for group in (g.input, g.output, g.node, g.initializer):
        h.update(len(group).to_bytes(8, "little"))
        for item in group:
            b = item.SerializeToString()
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def default_cache_dir() -> Path:
    """``$FLATPACK_CACHE_DIR/profiles`` if set, else ``~/.cache/flatpack/profiles``."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env is not None:
        if not env.strip():
            raise ValueError(f"{CACHE_DIR_ENV} is set but empty; unset it or give a directory")
        return Path(env).expanduser() / "profiles"
    return Path.home() / ".cache" / "flatpack" / "profiles"


class ProfileCache:
    """Measurements on disk, one JSON file each, under ``root/<machine id>/``.

    Keys are made with :meth:`key` from content identifiers (a model hash, a unit index, a thread
    count, ...); the machine fingerprint is part of the directory, so another machine's (or another
    onnxruntime's) measurements are never returned. Writes are atomic (temp file + rename), so
    concurrent profilers can share a cache.
    """

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.dir = self.root / machine_info()["id"]

    @staticmethod
    def key(*parts: object) -> str:
        return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get_json(self, key: str) -> dict[str, Any] | None:
        p = self._path(key)
        try:
            with open(p) as f:
                d = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable cache entry %s: %s", p, e)
            return None
        return d if isinstance(d, dict) else None

    def put_json(self, key: str, value: Mapping[str, Any]) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(value, f)
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def get(self, key: str) -> Measurement | None:
        d = self.get_json(key)
        if d is None or "measurement" not in d:
            return None
        try:
            return Measurement.from_json(d["measurement"])
        except (KeyError, TypeError, ValueError) as e:
            log.warning("ignoring malformed cache entry %s: %s", key, e)
            return None

    def put(self, key: str, m: Measurement, **meta: Any) -> None:
        self.put_json(key, {"measurement": m.to_json(), **meta})


# -- the measuring process ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    threads: int
    warmup: int
    reps: int


def _save(model: onnx.ModelProto, path: Path) -> None:
    from partitioner.export import save_model

    save_model(model, path)


def _write_inputs(model: onnx.ModelProto | Path, path: Path) -> None:
    feeds = random_inputs(model, seed=0)
    np.savez(path, **feeds)


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYTHONSTARTUP", None)
    # numpy's BLAS pool is not what is measured; one thread keeps the fork server single-threaded
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _read_lines(proc: subprocess.Popen[bytes], deadline: float, buf: bytearray) -> list[dict[str, Any]]:
    """Read until at least one complete JSON line arrives (or the process ends / the deadline passes)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while b"\n" not in buf:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf.extend(chunk)
    out = []
    while b"\n" in buf:
        line, _, rest = bytes(buf).partition(b"\n")
        buf[:] = rest
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                log.debug("measure worker said: %s", line[:200])
    return out


def _measurement(msg: Mapping[str, Any], cold_ms: float) -> Measurement:
    times = np.asarray(msg["times_ms"], dtype=float)
    return Measurement(
        median_ms=float(np.median(times)),
        p95_ms=float(np.percentile(times, 95)),
        peak_rss_mb=float(msg["peak_rss_mb"]),
        cold_start_ms=float(cold_ms),
        threads=int(msg["threads"]),
        reps=len(times),
        session_ms=float(msg["session_ms"]),
    )


def _converse(proc: subprocess.Popen[bytes], buf: bytearray, deadline: float, name: str, t_ref: float,
              start_ms: float) -> tuple[list[Measurement], str | None]:
    """Read one model's events until ``done`` or the end of the process's output.

    Cold start of the first run: ``start_ms`` (the process start already paid, 0 for a fresh process)
    plus the time from ``t_ref`` to ``ready``. Later runs share the process start and pay their own session.
    """
    ready: Mapping[str, Any] | None = None
    cold_first = 0.0
    results: list[Measurement] = []
    error: str | None = None
    while True:
        msgs = _read_lines(proc, deadline, buf)
        if not msgs and proc.poll() is not None:
            return results, error
        for msg in msgs:
            ev = msg.get("event")
            if ev == "ready":
                ready = msg
                cold_first = start_ms + (time.perf_counter() - t_ref) * 1e3
            elif ev == "error":
                error = f"measuring {name} failed: {msg.get('error')}"
            elif ev == "run" and ready is not None:
                cold = cold_first if not results else cold_first - ready["session_ms"] + msg["session_ms"]
                results.append(_measurement(msg, cold))
            elif ev == "done":
                if msg.get("status") not in (0, None) and error is None:
                    error = f"measuring {name}: the process exited with status {msg.get('status')}"
                return results, error


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)
        proc.kill()
    proc.wait()


def _stderr_tail(err: Any) -> str:
    err.seek(0)
    return err.read().decode(errors="replace")[-2000:].strip() or "(empty)"


def _start(args: Sequence[str], stdin: Any, err: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 - our own interpreter and module, arguments we built
        [sys.executable, "-m", "partitioner.measure_worker", *args],
        stdout=subprocess.PIPE, stderr=err, stdin=stdin, env=_worker_env(), cwd=str(_REPO_ROOT),
        start_new_session=True,  # its own process group, so a timeout kills a forked child too
    )


def _request(model_path: Path, inputs_path: Path, runs: Sequence[_Run]) -> str:
    return json.dumps({"model": str(model_path), "inputs": str(inputs_path), "runs": [asdict(r) for r in runs]})


def _check_results(results: list[Measurement], error: str | None, runs: Sequence[_Run], name: str,
                   err: Any) -> list[Measurement]:
    if error is not None:
        raise MeasureError(error)
    if len(results) < len(runs):
        raise MeasureError(f"measuring {name}: the process ended after {len(results)} of {len(runs)} runs; "
                           f"stderr: {_stderr_tail(err)}")
    return results


def _spawn(model_path: Path, inputs_path: Path, runs: Sequence[_Run], timeout_s: float) -> list[Measurement]:
    """Measure ``runs`` (one model, several thread counts) in a freshly spawned process: the cold start is
    spawn to session ready, end to end."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = _start([_request(model_path, inputs_path, runs)], subprocess.DEVNULL, err)
        try:
            results, error = _converse(proc, bytearray(), t0 + timeout_s, model_path.name, t0, 0.0)
        except TimeoutError:
            raise MeasureError(f"measuring {model_path.name} took longer than {timeout_s:.0f} s; "
                               "raise timeout_s or lower reps") from None
        finally:
            _kill(proc)
        return _check_results(results, error, runs, model_path.name, err)


class _ForkServer:
    """A measuring fork server (``measure_worker --serve``): each model runs in a child forked from a process
    that has numpy and onnxruntime imported, so it gets a process of its own without paying the interpreter
    start and the imports again. Cold start = the server's measured start (spawn to imports done) + the
    child's fork, input load and session creation. Peaks are those of a fresh process: the child's peak
    plus the measured difference between a fresh and a forked process on a trivial model."""

    def __init__(self, fresh_base_mb: float, start_timeout_s: float = 60.0) -> None:
        self._err = tempfile.TemporaryFile()
        self.offset_mb = 0.0
        t0 = time.perf_counter()
        self.proc = _start(["--serve"], subprocess.PIPE, self._err)
        self.buf = bytearray()
        try:
            while True:
                msgs = _read_lines(self.proc, t0 + start_timeout_s, self.buf)
                if not msgs and self.proc.poll() is not None:
                    raise MeasureError(f"the measuring server did not start; stderr: {_stderr_tail(self._err)}")
                if any(m.get("event") == "started" for m in msgs):
                    break
        except TimeoutError:
            self.close()
            raise MeasureError(f"the measuring server did not start in {start_timeout_s:.0f} s") from None
        except BaseException:
            self.close()
            raise
        self.start_ms = (time.perf_counter() - t0) * 1e3
        # A forked child does not count the interpreter's file-backed pages until it touches them again,
        # so its peak reads lower than a fresh process's by a constant (about 10 MB here); measure that
        # constant on the trivial model and add it back, so peaks mean the same in both isolations.
        with tempfile.TemporaryDirectory(prefix="flatpack-measure-") as tmp:
            path, inputs = _prepare(_trivial_model(), Path(tmp))
            child = self.measure(path, inputs, [_Run(1, 1, 3)], start_timeout_s)[0]
        self.offset_mb = fresh_base_mb - child.peak_rss_mb

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def measure(self, model_path: Path, inputs_path: Path, runs: Sequence[_Run], timeout_s: float
                ) -> list[Measurement]:
        assert self.proc.stdin is not None
        t0 = time.perf_counter()
        try:
            self.proc.stdin.write((_request(model_path, inputs_path, runs) + "\n").encode())
            self.proc.stdin.flush()
            results, error = _converse(self.proc, self.buf, t0 + timeout_s, model_path.name, t0, self.start_ms)
        except TimeoutError:
            self.close()
            raise MeasureError(f"measuring {model_path.name} took longer than {timeout_s:.0f} s; "
                               "raise timeout_s or lower reps") from None
        except (BrokenPipeError, OSError) as e:
            self.close()
            raise MeasureError(f"the measuring server died: {e}; stderr: {_stderr_tail(self._err)}") from e
        results = _check_results(results, error, runs, model_path.name, self._err)
        if self.offset_mb:
            results = [replace(m, peak_rss_mb=m.peak_rss_mb + self.offset_mb) for m in results]
        return results

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill(self.proc)
        self._err.close()


def _prepare(source: onnx.ModelProto | Path, d: Path) -> tuple[Path, Path]:
    """The model file (written if given as a proto) and an inputs file for it, under ``d``."""
    if isinstance(source, onnx.ModelProto):
        path = d / "model.onnx"
        _save(source, path)
    else:
        path = Path(source)
        if not path.is_file():
            raise MeasureError(f"{path}: no such model file")
    inputs = d / "inputs.npz"
    _write_inputs(source, inputs)
    return path, inputs


def _measure_source(source: onnx.ModelProto | Path, runs: Sequence[_Run], timeout_s: float,
                    server: _ForkServer | None = None) -> list[Measurement]:
    with tempfile.TemporaryDirectory(prefix="flatpack-measure-") as tmp:
        path, inputs = _prepare(source, Path(tmp))
        if server is not None:
            return server.measure(path, inputs, runs, timeout_s)
        return _spawn(path, inputs, runs, timeout_s)


def _check_threads(threads: int) -> None:
    if threads < 1:
        raise ValueError(f"threads={threads}: a function has at least one thread")


def measure_model(model: onnx.ModelProto | Path, *, threads: int, warmup: int = 3, reps: int = 10,
                  timeout_s: float = 120) -> Measurement:
    """Measure ``model`` in a fresh process with ``threads`` intra-op threads (see the module docstring).

    Thread counts above this machine's cores are measured as asked but oversubscribe the CPU; the
    profilers never ask for them.
    """
    _check_threads(threads)
    if reps < 1:
        raise ValueError(f"reps={reps}: need at least one timed run")
    return _measure_source(model, [_Run(threads, warmup, reps)], timeout_s)[0]


def measure_many(
    items: Sequence[tuple[str, ModelSource, int]],
    *,
    progress: ProgressFn | None = None,
    budget_s: float | None = None,
    cache: ProfileCache | None = None,
    warmup: int = 3,
    reps: int = 10,
    timeout_s: float = 120,
    stats: dict[str, int] | None = None,
    isolation: Isolation = "fork",
) -> dict[str, Measurement]:
    """Measure ``(key, model, threads)`` items, one after the other (parallel runs would disturb timings).

    Items that share the same model object (the same ModelProto, path or factory) run in one process,
    one session per thread count, in the order given. The high-water mark is reset between runs, but
    heap the earlier session left behind can add a few MB to a later run's peak: the first run's peak is
    the clean one (``profile_graph`` runs the most threads first and takes its peak). Different models
    never share a process.

    ``key`` must identify the item's content (e.g. a model hash plus a part id) when a ``cache`` is
    given: cached keys are not measured again. ``budget_s`` bounds the wall time spent measuring: it is
    checked before each process starts, which it does only if the budget is not spent and the previous
    process's time still fits (so the overrun is at most one process, and a positive budget always
    measures the first model). Items not reached are absent from the result. Order items most important
    first so that the budget goes where it matters. ``stats``, if given, receives counts: ``cached``,
    ``measured``, ``skipped`` (left out by the budget) and ``processes``.

    ``isolation``: "fork" (the default where the OS has fork) measures each model in a child of a fork
    server that has already imported numpy and onnxruntime (see :class:`_ForkServer`): a process of its
    own without the ~0.3 s interpreter start each time; "spawn" starts a fresh interpreter per model.
    """
    if isolation not in ("fork", "spawn"):
        raise ValueError(f"isolation must be 'fork' or 'spawn', got {isolation!r}")
    keys = [k for k, _, _ in items]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"measure_many: item keys must be unique; repeated: {dup[:5]}")
    out: dict[str, Measurement] = {}
    total = len(items)
    done = 0

    def ckey(key: str, threads: int) -> str:
        return ProfileCache.key("item", key, threads, warmup, reps)

    # group uncached items by model object, keeping first-seen order
    groups: dict[int, tuple[ModelSource, list[tuple[str, int]]]] = {}
    for key, source, threads in items:
        _check_threads(threads)
        hit = cache.get(ckey(key, threads)) if cache is not None else None
        if hit is not None:
            out[key] = hit
            done += 1
            if progress:
                progress(done, total, key)
            continue
        groups.setdefault(id(source), (source, []))[1].append((key, threads))
    counts = stats if stats is not None else {}
    counts.update(cached=done, measured=0, skipped=0, processes=0)
    spent = 0.0
    last = 0.0
    use_fork = isolation == "fork" and _can_fork()
    server: _ForkServer | None = None
    try:
        for source, members in groups.values():
            if budget_s is not None and (spent >= budget_s or (spent > 0 and spent + last > budget_s)):
                log.info("measuring budget of %.1f s spent; %d items left unmeasured", budget_s, total - done)
                break
            t = time.perf_counter()
            if use_fork and (server is None or not server.alive):
                server = _ForkServer(runtime_base_mb(cache=cache))
            resolved = source() if callable(source) else source
            got = _measure_source(resolved, [_Run(th, warmup, reps) for _, th in members], timeout_s, server)
            last = time.perf_counter() - t
            spent += last
            counts["processes"] += 1
            counts["measured"] += len(got)
            for (key, th), m in zip(members, got, strict=True):
                out[key] = m
                if cache is not None:
                    cache.put(ckey(key, th), m, item=key)
                done += 1
                if progress:
                    progress(done, total, key)
    finally:
        if server is not None:
            server.close()
    counts["skipped"] = total - done
    return out


def _can_fork() -> bool:
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def _trivial_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "base", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def runtime_base_mb(*, cache: ProfileCache | None = None) -> float:
    """Peak RSS (MB) of a measuring process with numpy and onnxruntime imported and a one-node session:
    what every function holds before its model's weights and activations. Cached per machine."""
    return _runtime_base(cache).peak_rss_mb


def _runtime_base(cache: ProfileCache | None) -> Measurement:
    """The trivial model measured in a fresh process: its peak is the runtime base, its cold start that
    of a function with (almost) no weights."""
    key = ProfileCache.key("runtime-base")
    if cache is not None:
        hit = cache.get(key)
        if hit is not None:
            return hit
    m = measure_model(_trivial_model(), threads=1, warmup=1, reps=3)
    if cache is not None:
        cache.put(key, m, item="runtime-base")
    return m


# ------------------------------------------------------------------------------------------------
# Profiles of a layer graph
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitProfile:
    """Time and memory of one unit's stage model. ``time_ms``/``p95_ms``: thread count -> ms.

    ``measured=False``: predicted (the budget ran out before this unit was measured).
    ``peak_rss_mb`` and ``cold_start_ms`` are those of the largest thread count, measured in a fresh
    process (more threads never need less memory; the difference is a fraction of a MB).
    """

    index: int
    time_ms: dict[int, float]
    p95_ms: dict[int, float]
    peak_rss_mb: float
    cold_start_ms: float
    flops: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    measured: bool
    label: str = ""
    activation_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["time_ms"] = {str(k): v for k, v in self.time_ms.items()}
        d["p95_ms"] = {str(k): v for k, v in self.p95_ms.items()}
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> UnitProfile:
        return cls(
            index=int(d["index"]),
            time_ms={int(k): float(v) for k, v in d["time_ms"].items()},
            p95_ms={int(k): float(v) for k, v in d["p95_ms"].items()},
            peak_rss_mb=float(d["peak_rss_mb"]),
            cold_start_ms=float(d["cold_start_ms"]),
            flops=int(d["flops"]),
            weight_bytes=int(d["weight_bytes"]),
            input_bytes=int(d["input_bytes"]),
            output_bytes=int(d["output_bytes"]),
            measured=bool(d["measured"]),
            label=str(d.get("label", "")),
            activation_bytes=int(d.get("activation_bytes", 0)),
        )


@dataclass(frozen=True)
class GraphProfile:
    """Profiles of every unit of one model on this machine.

    ``base_mb``: :func:`runtime_base_mb`. ``threads``: the thread counts measured; ``skipped_threads``:
    those asked for but above this machine's cores (not measured; extrapolate).
    """

    model: str
    model_sha256: str
    base_mb: float
    threads: tuple[int, ...]
    units: tuple[UnitProfile, ...]
    machine: dict[str, Any]
    created: str
    skipped_threads: tuple[int, ...] = ()
    warmup: int = 3
    reps: int = 10
    measure_s: float = 0.0  # wall time spent measuring for this call (0 when everything was cached)

    @property
    def measured_units(self) -> int:
        return sum(u.measured for u in self.units)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "model": self.model,
            "model_sha256": self.model_sha256,
            "base_mb": self.base_mb,
            "threads": list(self.threads),
            "skipped_threads": list(self.skipped_threads),
            "warmup": self.warmup,
            "reps": self.reps,
            "measure_s": self.measure_s,
            "machine": dict(self.machine),
            "created": self.created,
            "units": [u.to_json() for u in self.units],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GraphProfile:
        fmt = int(d.get("format", FORMAT_VERSION))
        if fmt > FORMAT_VERSION:
            raise ValueError(f"profile format {fmt} is newer than this flatpack's ({FORMAT_VERSION}); upgrade flatpack")
        return cls(
            model=str(d["model"]),
            model_sha256=str(d["model_sha256"]),
            base_mb=float(d["base_mb"]),
            threads=tuple(int(t) for t in d["threads"]),
            units=tuple(UnitProfile.from_json(u) for u in d["units"]),
            machine=dict(d.get("machine", {})),
            created=str(d.get("created", "")),
            skipped_threads=tuple(int(t) for t in d.get("skipped_threads", ())),
            warmup=int(d.get("warmup", 3)),
            reps=int(d.get("reps", 10)),
            measure_s=float(d.get("measure_s", 0.0)),
        )

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> GraphProfile:
        with open(path) as f:
            return cls.from_json(json.load(f))


def _split_threads(threads: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    cores = os.cpu_count() or 1
    asked = tuple(sorted(set(int(t) for t in threads)))
    if not asked:
        raise ValueError("threads: give at least one thread count")
    for t in asked:
        _check_threads(t)
    ok = tuple(t for t in asked if t <= cores)
    skipped = tuple(t for t in asked if t > cores)
    if skipped:
        log.warning("not measuring %s threads: this machine has %d cores (left to extrapolation)", skipped, cores)
    if not ok:
        ok = (min(cores, asked[0]),)
    return ok, skipped


def _by_importance(work: Sequence[tuple[int, int]]) -> list[int]:
    """Indices of ``(flops, weight_bytes)`` pairs, most important first: share of the model's FLOPs plus
    share of its weights, so the units that dominate its time and those that size its memory (a VGG's
    first FC layer: few FLOPs, most of the weights) are measured before a budget runs out."""
    total_f = sum(f for f, _ in work) or 1
    total_w = sum(w for _, w in work) or 1
    return sorted(range(len(work)), key=lambda i: -(work[i][0] / total_f + work[i][1] / total_w))


def _stage_key(lg: LayerGraph, sha: str, first: int, last: int) -> str:
    """What a stage's measurement is keyed by: the model's hash and the nodes the stage runs (not only the
    unit indices, which mean other nodes if the unit builder changes)."""
    nodes = ",".join(str(i) for i in lg.stage_nodes(first, last))
    return f"{sha}:stage:{first}-{last}:{hashlib.sha256(nodes.encode()).hexdigest()[:16]}"


def _unit_model_factory(lg: LayerGraph, index: int) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        whole = CutStage(lg, index, index).cut(Split()).whole
        assert whole is not None
        return whole

    return build


@overload
def profile_graph(lg: LayerGraph, *, threads: Sequence[int] = ..., warmup: int = ..., reps: int = ...,
                  budget_s: float | None = ..., cache_dir: str | Path | None = ..., progress: ProgressFn | None = ...,
                  timeout_s: float = ..., cached_only: Literal[False] = ...) -> GraphProfile: ...


@overload
def profile_graph(lg: LayerGraph, *, threads: Sequence[int] = ..., warmup: int = ..., reps: int = ...,
                  budget_s: float | None = ..., cache_dir: str | Path | None = ..., progress: ProgressFn | None = ...,
                  timeout_s: float = ..., cached_only: bool) -> GraphProfile | None: ...


def profile_graph(
    lg: LayerGraph,
    *,
    threads: Sequence[int] = (1, 2),
    warmup: int = 3,
    reps: int = 10,
    budget_s: float | None = None,
    cache_dir: str | Path | None = None,
    progress: ProgressFn | None = None,
    timeout_s: float = 300,
    cached_only: bool = False,
) -> GraphProfile | None:
    """Measure every unit's stage model (``CutStage(lg, u, u)``, unsplit) at each thread count.

    Cached on disk (``cache_dir``, default :func:`default_cache_dir`): a second call measures nothing.
    With ``budget_s`` the units that matter most (share of FLOPs plus share of weights) are measured first;
    those the budget does not reach are predicted (``measured=False``) by the predictors saved under the
    cache directory when there are any (``flatpack bench predictors`` saves them; memory with their
    held-out error margin), else by a FLOPs/bytes fit to the measured units.

    Thread counts above this machine's cores are not measured but listed in ``skipped_threads``; if every
    count asked is above them, the profile is measured at the core count instead.

    ``cached_only``: measure nothing; return the profile if every unit is in the cache, else None (the
    only case that returns None).
    """
    ok, skipped = _split_threads(threads)
    cache = ProfileCache(cache_dir)
    sha = model_sha256(lg.model)
    if cached_only and cache.get(ProfileCache.key("runtime-base")) is None:
        return None
    base = runtime_base_mb(cache=cache)
    stats: dict[str, int] = {}
    order = _by_importance([(u.flops, u.weight_bytes) for u in lg.units])
    items: list[tuple[str, ModelSource, int]] = []
    keys = {i: _stage_key(lg, sha, i, i) for i in order}
    for i in order:
        factory = _unit_model_factory(lg, i)
        # most threads first: that run has the process to itself, so its peak memory is the clean one
        items.extend((f"{keys[i]}:t{t}", factory, t) for t in sorted(ok, reverse=True))
    t_measure = time.perf_counter()
    got = measure_many(items, progress=progress, budget_s=0.0 if cached_only else budget_s, cache=cache,
                       warmup=warmup, reps=reps, timeout_s=timeout_s, stats=stats)
    if cached_only and len(got) < len(items):
        return None
    measure_s = time.perf_counter() - t_measure if stats["measured"] else 0.0
    measured: dict[int, dict[int, Measurement]] = {}
    for i in range(len(lg.units)):
        ms = {t: got[f"{keys[i]}:t{t}"] for t in ok if f"{keys[i]}:t{t}" in got}
        if len(ms) == len(ok):
            measured[i] = ms
    units: list[UnitProfile | None] = [None] * len(lg.units)
    for i, ms in measured.items():
        u = lg.units[i]
        first = ms[max(ok)]
        units[i] = UnitProfile(
            index=i,
            time_ms={t: ms[t].median_ms for t in ok},
            p95_ms={t: ms[t].p95_ms for t in ok},
            peak_rss_mb=first.peak_rss_mb,
            cold_start_ms=first.cold_start_ms,
            flops=u.flops,
            weight_bytes=u.weight_bytes,
            input_bytes=u.input_bytes,
            output_bytes=u.output_bytes,
            measured=True,
            label=u.label,
            activation_bytes=u.activation_bytes,
        )
    missing = [i for i in range(len(lg.units)) if units[i] is None]
    if missing:
        log.info("%d of %d units predicted (budget %.1f s)", len(missing), len(lg.units), budget_s or 0)
        for p in _predict_units(lg, [x for x in units if x is not None], missing, ok, base, cache.root):
            units[p.index] = p
    return GraphProfile(
        model=lg.name,
        model_sha256=sha,
        base_mb=base,
        threads=ok,
        units=tuple(u for u in units if u is not None),
        machine={**machine_info(), "loadavg_1m": _loadavg()},
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        skipped_threads=skipped,
        warmup=warmup,
        reps=reps,
        measure_s=measure_s,
    )


def _predict_units(lg: LayerGraph, measured: Sequence[UnitProfile], missing: Sequence[int], threads: Sequence[int],
                   base_mb: float, cache_root: Path) -> list[UnitProfile]:
    """Profiles for units that were not measured: saved predictors if any, scaled to agree with the measured
    units of this model; otherwise a FLOPs/bytes fit to them (or generic constants when none was measured)."""
    from partitioner import predictors as pr

    saved = pr.load_saved_predictors(cache_root)
    feats = {(i, t): pr.stage_features(lg, i, i, t) for i in missing for t in threads}
    time_of: dict[tuple[int, int], float] = {}
    mem_of: dict[int, float] = {}
    if saved is not None:
        tp, mp = saved
        keys = list(feats)
        t_pred = tp.predict([feats[k] for k in keys])
        scale = _time_calibration(lg, measured, threads, tp)
        time_of = {k: float(v) * scale.get(k[1], 1.0) for k, v in zip(keys, t_pred, strict=True)}
        # with the held-out error margin: an under-predicted peak is an out-of-memory function
        m_pred = mp.predict([feats[(i, max(threads))] for i in missing], safe=True)
        mem_of = {i: base_mb + float(v) for i, v in zip(missing, m_pred, strict=True)}
    else:
        fit = pr.FlopsFit.fit(measured, lg, base_mb)
        for i in missing:
            u = lg.units[i]
            for t in threads:
                time_of[(i, t)] = fit.time_ms(u.flops, t)
            mem_of[i] = fit.memory_mb(u.weight_bytes, u.activation_bytes + u.input_bytes)
    ratio = float(np.median([u.p95_ms[t] / u.time_ms[t] for u in measured for t in threads if u.time_ms[t] > 0])
                  ) if measured else 1.1
    # the trivial model anchors the line at no weights
    cold = [(0, _runtime_base(ProfileCache(cache_root)).cold_start_ms)] + [(u.weight_bytes, u.cold_start_ms)
                                                                           for u in measured]
    out = []
    for i in missing:
        u = lg.units[i]
        out.append(UnitProfile(
            index=i,
            time_ms={t: time_of[(i, t)] for t in threads},
            p95_ms={t: time_of[(i, t)] * ratio for t in threads},
            peak_rss_mb=max(mem_of[i], base_mb),
            cold_start_ms=_cold_start_estimate(cold, u.weight_bytes),
            flops=u.flops,
            weight_bytes=u.weight_bytes,
            input_bytes=u.input_bytes,
            output_bytes=u.output_bytes,
            measured=False,
            label=u.label,
            activation_bytes=u.activation_bytes,
        ))
    return out


def _time_calibration(lg: LayerGraph, measured: Sequence[UnitProfile], threads: Sequence[int],
                      tp: Any) -> dict[int, float]:
    """Per thread count, the median ratio measured / predicted over this model's measured units (1 if none):
    corrects a predictor trained elsewhere for this machine's speed."""
    from partitioner import predictors as pr

    out: dict[int, float] = {}
    for t in threads:
        if not measured:
            continue
        pred = tp.predict([pr.stage_features(lg, u.index, u.index, t) for u in measured])
        ratios = [u.time_ms[t] / p for u, p in zip(measured, pred, strict=True) if p > 0 and u.time_ms[t] > 0]
        if ratios:
            out[t] = float(np.clip(np.median(ratios), 0.2, 5.0))
    return out


def _loadavg() -> float | None:
    """The 1-minute load average while profiling: above the core count, other work competed for the CPU
    and the timings are inflated (the CLI warns)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _cold_start_estimate(points: Sequence[tuple[int, float]], weight_bytes: int) -> float:
    """Cold start grows with the weights a session loads: a line through ``(weight bytes, ms)`` points (the
    trivial model and the measured units); with one point, that point plus 1 ms per 4 MB of weights."""
    if len({w for w, _ in points}) >= 2:
        w = np.array([p[0] for p in points], dtype=float)
        c = np.array([p[1] for p in points], dtype=float)
        slope, icpt = np.polyfit(w, c, 1)
        return float(max(icpt + max(slope, 0.0) * weight_bytes, float(c.min())))
    if points:
        return float(points[0][1]) + weight_bytes / (4 * 2**20)
    return 400.0 + weight_bytes / (4 * 2**20)


def profile_options(
    lg: LayerGraph,
    options: Sequence[tuple[int, int, Split]],
    *,
    threads: int = 1,
    warmup: int = 3,
    reps: int = 10,
    all_parts: bool = False,
    budget_s: float | None = None,
    cache_dir: str | Path | None = None,
    progress: ProgressFn | None = None,
    timeout_s: float = 300,
) -> dict[OptionKey, Measurement]:
    """Measure part models of split options ``(first, last, split)`` at ``threads``.

    By default only the largest part of each option (by FLOPs, which bounds the stage's fork) is measured;
    ``all_parts`` measures every part. Unsplit options (``Split("none")``) measure the whole stage as
    part 0. Options that are not admissible are skipped (logged). Cached like :func:`profile_graph`;
    under ``budget_s`` the parts that matter most go first and the result holds only what was measured.
    """
    ok, skipped = _split_threads([threads])
    if skipped:
        raise ValueError(f"threads={threads} exceeds this machine's {os.cpu_count()} cores; it cannot be "
                         "measured honestly (let the performance model extrapolate)")
    cache = ProfileCache(cache_dir)
    sha = model_sha256(lg.model)
    cutters: dict[tuple[int, int], CutStage] = {}
    # the last cut only: parts of one option are built together, and holding every cut would hold the
    # model's weights many times over
    built: dict[tuple[int, int, Split], Any] = {}

    def cutter(first: int, last: int) -> CutStage:
        cs = cutters.get((first, last))
        if cs is None:
            cs = cutters[(first, last)] = CutStage(lg, first, last)
        return cs

    def factory(first: int, last: int, split: Split, k: int) -> Callable[[], onnx.ModelProto]:
        def build() -> onnx.ModelProto:
            key = (first, last, split)
            if key not in built:
                built.clear()
                built[key] = cutter(first, last).cut(split)
            cut = built[key]
            return cut.whole if cut.whole is not None else cut.parts[k].model

        return build

    work: list[tuple[tuple[int, int], str, ModelSource, int, OptionKey]] = []
    for first, last, split in options:
        try:
            costs = cutter(first, last).costs(split)
        except (NotSplittable, ValueError) as e:
            log.info("skipping %d-%d %s: %s", first, last, split, e)
            continue
        picks = range(len(costs)) if all_parts else [int(np.argmax([c.flops for c in costs]))]
        for k in picks:
            okey: OptionKey = (first, last, str(split), k)
            key = f"{_stage_key(lg, sha, first, last)}:part:{split}:{k}:t{threads}"
            work.append(((costs[k].flops, costs[k].weight_bytes), key, factory(first, last, split, k), threads, okey))
    work = [work[i] for i in _by_importance([w[0] for w in work])]
    got = measure_many([(key, src, th) for _, key, src, th, _ in work], progress=progress, budget_s=budget_s,
                       cache=cache, warmup=warmup, reps=reps, timeout_s=timeout_s)
    return {okey: got[key] for _, key, _, _, okey in work if key in got}
