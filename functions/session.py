"""onnxruntime sessions for parts, created once per file and cached by their owner.

onnxruntime is imported when the first session is made, so the rest of the function runtime loads in an
environment without it (the MXNet backend's, see :mod:`functions.backends`).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["SessionCache", "make_session", "map_weights"]

log = logging.getLogger(__name__)

# onnxruntime's input types that a warm-up feeds zeros of
_ZEROS = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
          "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
          "tensor(bool)": np.bool_}


def make_session(path: str | Path | bytes, *, intra_op_threads: int = 0) -> ort.InferenceSession:
    """A CPU session for ``path`` (or a serialized model); ``intra_op_threads`` 0 lets onnxruntime choose (all
    cores)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    # Functions share cores with other functions (and the endpoint with its event loop): spinning
    # intra-op threads burn the CPU the others need, for a gain of microseconds.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if intra_op_threads > 0:
        so.intra_op_num_threads = intra_op_threads
        so.inter_op_num_threads = 1
    source = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(source, sess_options=so, providers=["CPUExecutionProvider"])


#: what a function keeps free of its memory size when it maps its weights in: the activations and buffers
#: of its runs (the warm-up's run has grown the arena already) and the runtime's own growth
MAP_HEADROOM_MB = 32


def map_weights(path: str | Path, *, limit_mb: float | None = None) -> int:
    """Fault in the pages this process maps from the directory of the model at ``path`` (while its resident
    memory stays ``MAP_HEADROOM_MB`` under ``limit_mb``, if given), and return how many bytes that was (0 where
    ``/proc/self/maps`` cannot be read: not Linux).

    onnxruntime maps a model's external data into memory rather than reading it. A kernel that packs its
    weights (a convolution's, a Gemm's) reads them all once when the session is made, but a lookup table is
    read where the requests point: each page is then mapped by the first request that touches it, a page
    fault at a time, over thousands of requests. In one process at one thread a DLRM's 2 GB of tables took
    0.96 ms a request over its first 50 requests and 0.18 ms over its 150th to 300th. One byte read per page,
    here, moves that into the cold start. A function whose memory size holds its tables but no more maps in
    what fits, and its requests fault in the rest, as before."""
    root = str(Path(path).resolve().parent) + os.sep
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    page = mmap.PAGESIZE
    total = 0
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[1].startswith("r") or not fields[5].startswith(root):
            continue
        if fields[5].endswith((" (deleted)", ".so")):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        n = (hi - lo) // page
        if limit_mb is not None:
            room = (limit_mb - MAP_HEADROOM_MB) * 2**20 - _resident_bytes()
            n = min(n, max(0, int(room // page)))  # pages already in count twice here: a margin, not a bound
        if n <= 0:
            continue
        region = memoryview((ctypes.c_ubyte * (n * page)).from_address(lo)).cast("B")
        np.frombuffer(region, dtype=np.uint8)[::page].max()  # the read is the point: each page faults in
        total += n * page
    return total


def _resident_bytes() -> int:
    """This process's resident memory now (``/proc/self/statm``), in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


class SessionCache:
    """Sessions keyed by resolved file path; safe to share between threads.

    A path is resolved once: resolving takes a system call per component (tens of microseconds, more
    than a small part's run), so the path as given is remembered too.
    """

    def __init__(self, *, intra_op_threads: int = 0, memory_mb: float | None = None) -> None:
        self._threads = intra_op_threads
        self._memory_mb = memory_mb  # the function's memory size, which mapping its weights in stays under
        self._sessions: dict[Path, ort.InferenceSession] = {}
        self._given: dict[str | Path, ort.InferenceSession] = {}
        self._names: dict[ort.InferenceSession, tuple[list[str], list[str]]] = {}
        self._lock = threading.Lock()

    def get(self, path: str | Path) -> ort.InferenceSession:
        sess = self._given.get(path)
        if sess is not None:
            return sess
        key = Path(path).resolve()
        with self._lock:
            sess = self._sessions.get(key)
            if sess is None:
                sess = make_session(key, intra_op_threads=self._threads)
                self._sessions[key] = sess
            self._given[path] = sess
            return sess

    def input_names(self, path: str | Path) -> list[str]:
        return [i.name for i in self.get(path).get_inputs()]

    def warm_up(self, path: str | Path) -> bool:
        """Map the part's weights in (:func:`map_weights`) and run it once on zeros, so that its first request
        does not pay onnxruntime's first run (its memory arena grown, each kernel's first call): on a fresh
        instance at a fraction of a core that was tens of ms. False where the part's inputs have no fixed shape,
        or it fails on zeros (a shape tensor among its inputs): its first request then pays it, as before."""
        sess = self.get(path)
        mapped = map_weights(path, limit_mb=self._memory_mb)
        if mapped:
            log.debug("%s: %d MB of weights mapped in", path, mapped >> 20)
        feeds = {}
        for i in sess.get_inputs():
            dtype = _ZEROS.get(i.type)
            if dtype is None or not all(isinstance(d, int) and d >= 0 for d in i.shape):
                return False
            feeds[i.name] = np.zeros(i.shape, dtype)
        try:
            sess.run(None, feeds)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own untyped errors
            log.debug("no warm-up run of %s on zeros: %s", path, e)
            return False
        return True

    def run(self, path: str | Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        sess = self.get(path)
        names = self._names.get(sess)
        if names is None:  # asking the session builds its NodeArgs anew each time: a few us per request
            names = self._names[sess] = ([i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()])
        feeds = {n: np.ascontiguousarray(inputs[n]) for n in names[0]}
        return dict(zip(names[1], sess.run(names[1], feeds), strict=True))

    def __len__(self) -> int:
        return len(self._sessions)
