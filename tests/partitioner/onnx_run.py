"""Running an in-memory ONNX model with onnxruntime, for the partitioner's unit tests."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

__all__ = ["run_model"]


def run_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of ``model`` for ``feeds``, by name (CPU execution provider)."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))
