"""onnxruntime sessions for parts, created once per file and cached by their owner.

onnxruntime is imported when the first session is made, so the rest of the function runtime loads in an
environment without it (the MXNet backend's, see :mod:`functions.backends`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["SessionCache", "make_session"]


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

    def run(self, path: str | Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        sess = self.get(path)
        names = self._names.get(sess)
        if names is None:  # asking the session builds its NodeArgs anew each time: a few us per request
            names = self._names[sess] = ([i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()])
        feeds = {n: np.ascontiguousarray(inputs[n]) for n in names[0]}
        return dict(zip(names[1], sess.run(names[1], feeds), strict=True))

    def __len__(self) -> int:
        return len(self._sessions)
