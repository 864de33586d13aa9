"""The measuring process: ``python -m partitioner.measure_worker REQUEST_JSON`` or ``... --serve``.

Started by :mod:`partitioner.profile.measure` so that a model's run time, start-up and peak memory are
those of a serverless function that holds just this model. It imports what a function imports (numpy and
onnxruntime; never onnx, torch or the partitioner) and talks to the parent through JSON lines on stdout
(never pickle):

    request: {"model": PATH, "inputs": NPZ_PATH, "runs": [{"threads": N, "warmup": W, "reps": R}, ...]}
    {"event": "ready", "import_ms": .., "session_ms": .., "rss_before_session_mb": ..}   first session created
    {"event": "run", "threads": N, "times_ms": [..], "peak_rss_mb": .., "session_ms": ..}  one per run
    {"event": "error", "error": "..."}                                                   then exit status 1

One-shot mode (the request as argv[1]) measures one model in this fresh process. Serve mode (``--serve``)
is a fork server: it imports numpy and onnxruntime once, says ``{"event": "started", "import_ms": ..}``,
then for every request line on stdin forks a child that measures the model exactly as one-shot mode
would, and says ``{"event": "done", "status": ..}`` when the child has exited. Each model still gets a
process of its own (its own peak memory, its own session), without paying the interpreter start and
the imports again.

Each run after the first destroys the previous session and resets the peak-RSS high-water mark
(``/proc/self/clear_refs``, Linux 4.0+) before creating its own, so every run reports its own peak; where
the reset is not allowed the peak is the process's (monotone) peak and ``hwm_reset`` says so.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import gc  # noqa: E402 - the clock starts before the imports, which are part of a cold start
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

_IMPORT_MS = (time.perf_counter() - _T0) * 1e3


def _status_mb(field: str) -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return float(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _session(path: str, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])


def _run(request: dict) -> None:
    with np.load(request["inputs"], allow_pickle=False) as z:
        feeds = {k: np.ascontiguousarray(z[k]) for k in z.files}
    rss_before = _status_mb("VmRSS:")
    sess = None
    for k, run in enumerate(request["runs"]):
        threads = int(run["threads"])
        hwm_reset = False
        if sess is not None:
            sess = None
            gc.collect()
            hwm_reset = _reset_hwm()
        t = time.perf_counter()
        sess = _session(request["model"], threads)
        session_ms = (time.perf_counter() - t) * 1e3
        names = [o.name for o in sess.get_outputs()]
        wanted = {i.name for i in sess.get_inputs()}
        run_feeds = {n: v for n, v in feeds.items() if n in wanted}
        if k == 0:
            _emit({"event": "ready", "import_ms": _IMPORT_MS, "session_ms": session_ms,
                   "rss_before_session_mb": rss_before, "pid": os.getpid()})
        for _ in range(int(run["warmup"])):
            sess.run(names, run_feeds)
        times = []
        for _ in range(int(run["reps"])):
            t = time.perf_counter()
            sess.run(names, run_feeds)
            times.append((time.perf_counter() - t) * 1e3)
        _emit({"event": "run", "threads": threads, "times_ms": times, "peak_rss_mb": _status_mb("VmHWM:"),
               "session_ms": session_ms, "hwm_reset": hwm_reset})


def _one(request: dict) -> int:
    try:
        _run(request)
    except Exception as e:  # noqa: BLE001 - every failure goes back to the parent as a message
        _emit({"event": "error", "error": f"{type(e).__name__}: {e}"})
        return 1
    return 0


def _serve() -> int:
    _emit({"event": "started", "import_ms": _IMPORT_MS, "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as e:
            _emit({"event": "error", "error": f"bad request: {e}"})
            _emit({"event": "done", "status": 2})
            continue
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            # the child: a fresh address space for this model; its high-water mark starts from here
            _reset_hwm()
            code = _one(request)
            sys.stdout.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        _emit({"event": "done", "status": os.waitstatus_to_exitcode(status)})
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return _serve()
    return _one(json.loads(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
