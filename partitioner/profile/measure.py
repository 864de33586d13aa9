"""The measuring processes: each model timed with onnxruntime in a process of its own.

The other side of the pipe is :mod:`partitioner.measure_worker` (kept lean: it imports what a function
imports). One process per model, either spawned fresh (``python -m partitioner.measure_worker REQUEST``)
or forked from a fork server that has numpy and onnxruntime imported already (``--serve``); both report
the same figures (see :class:`_ForkServer`). Everything travels as JSON lines, never pickle.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeAlias

import numpy as np
import onnx
from onnx import TensorProto, helper

import partitioner
from partitioner.inputs import random_inputs
from partitioner.profile.cache import ProfileCache
from partitioner.profile.types import Measurement, ModelSource, ProgressFn

__all__ = ["Isolation", "MeasureError", "check_threads", "measure_many", "measure_model", "runtime_base",
           "runtime_base_mb"]

log = logging.getLogger(__name__)

# the checkout the measuring process imports ``partitioner.measure_worker`` from (this one, first)
_REPO_ROOT = Path(partitioner.__file__).resolve().parent.parent

Isolation: TypeAlias = Literal["fork", "spawn"]


class MeasureError(RuntimeError):
    """A measuring process failed (the model does not run, the process died, or it timed out)."""


@dataclass(frozen=True)
class _Run:
    threads: int
    warmup: int
    reps: int


def _save(model: onnx.ModelProto, path: Path) -> None:
    from partitioner.model_file import save_model

    save_model(model, path)


def _write_inputs(model: onnx.ModelProto | Path, path: Path) -> None:
    feeds: dict[str, Any] = dict(random_inputs(model, seed=0))
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


def check_threads(threads: int) -> None:
    if threads < 1:
        raise ValueError(f"threads={threads}: a function has at least one thread")


def measure_model(model: onnx.ModelProto | Path, *, threads: int, warmup: int = 3, reps: int = 10,
                  timeout_s: float = 120) -> Measurement:
    """Measure ``model`` in a fresh process with ``threads`` intra-op threads (see the module docstring).

    Thread counts above this machine's cores are measured as asked but oversubscribe the CPU; the
    profilers never ask for them.
    """
    check_threads(threads)
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
    ``measured``, ``skipped`` (left out by the budget) and ``processes``, and ``disturbed``: measurements
    whose runs spread as only other load makes them (:func:`disturbed`), used but never cached.

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
        check_threads(threads)
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
                why = disturbed(m)
                if why:
                    counts["disturbed"] = counts.get("disturbed", 0) + 1
                    log.warning("%s at %d thread(s) looks disturbed by other load (%s): used for this profile, "
                                "not cached; profile again on a quieter machine", key, th, why)
                elif cache is not None:
                    cache.put(ckey(key, th), m, item=key)
                done += 1
                if progress:
                    progress(done, total, key)
    finally:
        if server is not None:
            server.close()
    counts["skipped"] = total - done
    return out


#: a measurement whose p95 is more than this times its median was disturbed by other load on the machine
DISTURBED_P95 = 1.5
#: below this median, timer and scheduler noise alone spread the runs that much (as the planner's check)
_MIN_CHECKED_MS = 5.0


def disturbed(m: Measurement) -> str:
    """Why a measurement looks disturbed by other load ("" if it does not, or is too short to tell)."""
    if m.median_ms >= _MIN_CHECKED_MS and m.p95_ms > DISTURBED_P95 * m.median_ms:
        return f"p95 {m.p95_ms:.1f} ms is {m.p95_ms / m.median_ms:.2f}x the median {m.median_ms:.1f} ms"
    return ""


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
    return runtime_base(cache).peak_rss_mb


def runtime_base(cache: ProfileCache | None) -> Measurement:
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

