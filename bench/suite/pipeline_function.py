"""Gillis's Pipeline baseline as a function: one process that cannot hold the model, so per request it
loads each stage's part file from storage (a fresh onnxruntime session), runs it, drops it, and goes on.

:class:`PipelineTarget` starts it as ``python -m bench.suite.pipeline_function BUNDLE THREADS`` in a session
of its own (like a function instance) and speaks to it over stdin/stdout with length-prefixed frames (JSON
header + the tensor codec's bytes). The process imports only what a function imports (numpy,
onnxruntime, ``functions``), so its resident memory compares with an instance's. After each request it
reports its peak resident memory for that request; a request over the cap is counted as out of memory,
as the platform would kill the instance.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PipelineOutOfMemory", "PipelineTarget"]

_LEN = struct.Struct("<I")


def _pack(tensors: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None) -> bytes:
    from functions.codec import encode

    blobs = [encode(np.ascontiguousarray(v)) for v in tensors.values()]
    head = json.dumps({"names": list(tensors), "sizes": [len(b) for b in blobs], "meta": dict(meta or {})}).encode()
    return _LEN.pack(len(head)) + head + b"".join(blobs)


def _unpack(buf: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from functions.codec import decode

    (n,) = _LEN.unpack_from(buf)
    head = json.loads(buf[_LEN.size:_LEN.size + n])
    out, off = {}, _LEN.size + n
    for name, size in zip(head["names"], head["sizes"], strict=True):
        out[name] = decode(buf[off:off + size])
        off += size
    return out, head["meta"]


def _release_memory() -> None:
    """Give a dropped session's memory back to the system (glibc keeps freed arenas otherwise), as a
    function that loads layers one group at a time must, or its resident memory only ever grows."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux 4.0+)
    except OSError:
        pass


def _read_frame(stream: Any) -> bytes | None:
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (n,) = _LEN.unpack(head)
    body = stream.read(n)
    return body if len(body) == n else None


def _write_frame(stream: Any, body: bytes) -> None:
    stream.write(_LEN.pack(len(body)))
    stream.write(body)
    stream.flush()


def _serve(bundle_dir: str, threads: int) -> None:
    """The Pipeline function's process (``python -m bench.suite.pipeline_function BUNDLE THREADS``): per request
    read from stdin, load every stage's part from disk, run it, drop it; reply on stdout."""
    import sys
    import time

    from functions.executor import execute_plan
    from functions.plan import Plan
    from functions.procstat import peak_rss_mb
    from functions.session import make_session

    root = Path(bundle_dir)
    plan = Plan.load(root / "plan.json")

    class Loading:
        def __init__(self) -> None:
            self.load_ms = 0.0

        def run_stage(self, stage: Any, inputs: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
            out = []
            for part, x in zip(stage.parts, inputs, strict=True):
                t = time.perf_counter()
                sess = make_session(root / part.file, intra_op_threads=threads)
                self.load_ms += 1e3 * (time.perf_counter() - t)
                names = [o.name for o in sess.get_outputs()]
                feeds = {i.name: np.ascontiguousarray(x[i.name]) for i in sess.get_inputs()}
                out.append(dict(zip(names, sess.run(names, feeds), strict=True)))
                del sess
                _release_memory()
            return out

    def epilogue(stage: Any, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        sess = make_session(root / stage.epilogue, intra_op_threads=threads)
        feeds = {i.name: env[i.name] for i in sess.get_inputs()}
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feeds), strict=True))

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        msg = _read_frame(stdin)
        if not msg:
            return
        _reset_peak()
        runner = Loading()
        try:
            inputs, _ = _unpack(msg)
            outs = execute_plan(plan, inputs, runner, epilogue)
            _write_frame(stdout, _pack(outs, {"peak_rss_mb": peak_rss_mb(), "load_ms": runner.load_ms}))
        except Exception as e:  # noqa: BLE001 - the error goes back to the caller, who counts it
            _write_frame(stdout, _pack({}, {"error": f"{type(e).__name__}: {e}", "peak_rss_mb": peak_rss_mb()}))


class PipelineOutOfMemory(MemoryError):
    """The Pipeline function went over its memory cap while serving a request."""


class PipelineTarget:
    """Gillis's Pipeline baseline as a load-generator target (see the module docstring).

    ``bundle_dir``: a bundle whose stages are unsplit groups (:func:`pipeline_groups`) all run by the
    master; ``memory_mb``: the cap; ``threads``: onnxruntime threads (1 = a 1-vCPU function). The function
    is a process of its own (``python -m bench.suite.pipeline_function``, in a session of its own like an instance),
    spoken to over its stdin and stdout with length-prefixed frames.
    """

    def __init__(self, bundle_dir: str | Path, *, memory_mb: int, threads: int = 1, name: str = "pipeline") -> None:
        self.name = name
        self.memory_mb = memory_mb
        self.peaks: list[float] = []
        self.load_ms: list[float] = []
        # here, not at the top: the function process imports this module and must stay as lean as an instance
        from serving.platform.parent_death import die_with_parent
        from serving.platform.runtimes import project_pythonpath

        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": project_pythonpath()}
        self._proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "bench.suite.pipeline_function", str(Path(bundle_dir).resolve()), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, no locks taken
        )
        self._lock = threading.Lock()

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            _write_frame(self._proc.stdin, _pack(dict(inputs)))
            reply = _read_frame(self._proc.stdout)
        if reply is None:
            raise RuntimeError(f"the Pipeline function exited (code {self._proc.poll()})")
        outs, meta = _unpack(reply)
        peak = float(meta.get("peak_rss_mb", 0.0))
        self.peaks.append(peak)
        if "error" in meta:
            raise RuntimeError(meta["error"])
        self.load_ms.append(float(meta.get("load_ms", 0.0)))
        if peak > self.memory_mb:
            raise PipelineOutOfMemory(f"the Pipeline function used {peak:.0f} MB, over its {self.memory_mb} MB cap")
        return outs

    def usage(self) -> dict[str, dict[str, Any]]:
        return {}

    def close(self) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


if __name__ == "__main__":
    import sys as _sys

    _serve(_sys.argv[1], int(_sys.argv[2]))
