"""onnxruntime sessions for parts, created once per file and cached by their owner.

onnxruntime is imported when the first session is made, so the rest of the function runtime loads in an
environment without it (the MXNet backend's, see :mod:`functions.backends`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["SessionCache", "make_session"]

log = logging.getLogger(__name__)

# onnxruntime's input types that a warm-up feeds zeros of
_ZEROS = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
          "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
          "tensor(bool)": np.bool_}


def make_session(path: str | Path, *, intra_op_threads: int = 0) -> ort.InferenceSession:
    """A CPU session for ``path``; ``intra_op_threads`` 0 lets onnxruntime choose (all cores)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    # Functions share cores with other functions (and the endpoint with its event loop): spinning
    # intra-op threads burn the CPU the others need, for a gain of microseconds.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if intra_op_threads > 0:
        so.intra_op_num_threads = intra_op_threads
        so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


class SessionCache:
    """Sessions keyed by resolved file path; safe to share between threads.

    A path is resolved once: resolving takes a system call per component (tens of microseconds, more
    than a small part's run), so the path as given is remembered too.
    """

    def __init__(self, *, intra_op_threads: int = 0) -> None:
        self._threads = intra_op_threads
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
        """Run the part once on zeros, so that its first request does not pay onnxruntime's first run (its
        memory arena grown, each kernel's first call): on a fresh instance at a fraction of a core that was
        tens of ms. False where the part's inputs have no fixed shape, or it fails on zeros (a shape tensor
        among its inputs): its first request then pays it, as before."""
        sess = self.get(path)
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
