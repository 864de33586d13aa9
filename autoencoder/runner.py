"""Running a batch-1 ONNX model over many inputs: one batched session when the graph allows it.

Models exported for serving have a static batch of 1. Calibration and evaluation push thousands of
inputs through them, so :class:`BatchRunner` first tries a copy whose batch dimension is symbolic and
checks its first results against the batch-1 model; a graph that hard-codes the batch (a Reshape to
``[1, -1]``, say) fails that check and is run one input at a time instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

__all__ = ["BatchRunner", "session_for"]

log = logging.getLogger(__name__)

_BATCH = 128
_CHECK_RTOL = 1e-4


def session_for(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    """A CPU session for an in-memory model; ``threads`` intra-op threads (0: onnxruntime decides)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads > 0:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    data = model.SerializeToString()
    return ort.InferenceSession(data, sess_options=so, providers=["CPUExecutionProvider"])


def _dynamic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in (*m.graph.input, *m.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
            dims[0].dim_param = "batch"
    del m.graph.value_info[:]
    return m


class BatchRunner:
    """Runs ``model`` (static batch 1) on stacked inputs ``[n, ...]`` and returns stacked outputs.

    Args:
        model: a ModelProto under 2 GB, or a path to one.
        threads: onnxruntime intra-op threads (0: onnxruntime decides).
    """

    def __init__(self, model: onnx.ModelProto | str | Path, *, threads: int = 0) -> None:
        if not isinstance(model, onnx.ModelProto):
            model = onnx.load(str(model))
        self._model = model
        self._threads = threads
        self._static = session_for(model, threads)
        self.input_names = [i.name for i in self._static.get_inputs()]
        self.output_names = [o.name for o in self._static.get_outputs()]
        self._batched: ort.InferenceSession | None = None
        self._batched_ok: bool | None = None  # None: not tried yet

    def _try_batched(self, feeds: Mapping[str, np.ndarray], names: list[str]) -> bool:
        try:
            self._batched = session_for(_dynamic_batch(self._model), self._threads)
            first = {k: v[:2] for k, v in feeds.items()}
            got = self._batched.run(names, first)
            for i in range(len(next(iter(first.values())))):
                want = self._static.run(names, {k: v[i:i + 1] for k, v in first.items()})
                for g, w in zip(got, want, strict=True):
                    if g[i:i + 1].shape != w.shape or not np.allclose(g[i:i + 1], w, rtol=_CHECK_RTOL, atol=1e-5):
                        raise ValueError("batched results differ from batch-1 results")
        except Exception as e:  # noqa: BLE001 - any failure means: run one input at a time
            log.debug("model does not run batched (%s); running one input at a time", e)
            self._batched = None
            return False
        return True

    def run(self, feeds: Mapping[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """``feeds``: input name -> ``[n, ...]`` (each input's batch-1 shape with the 1 replaced by n)."""
        names = outputs or self.output_names
        feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
        n = len(next(iter(feeds.values())))
        if self._batched_ok is None:
            self._batched_ok = n >= 2 and self._try_batched(feeds, names)
        chunks: list[list[np.ndarray]] = []
        if self._batched_ok and self._batched is not None:
            for s in range(0, n, _BATCH):
                chunks.append(self._batched.run(names, {k: v[s:s + _BATCH] for k, v in feeds.items()}))
        else:
            for i in range(n):
                chunks.append(self._static.run(names, {k: v[i:i + 1] for k, v in feeds.items()}))
        return {name: np.concatenate([c[j] for c in chunks]) for j, name in enumerate(names)}

    @property
    def batched(self) -> bool:
        return bool(self._batched_ok)

