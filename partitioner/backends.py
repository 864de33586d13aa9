"""Part files for a part-execution backend other than onnxruntime (``export --backend mxnet``).

onnxruntime runs any part export writes. MXNet 1.9's ONNX importer needs opset <= 13 and every
initializer listed as a graph input, and lacks many ops: :func:`parts_for_backend` rewrites each part
(:func:`functions.backends.mxnet_onnx.to_mxnet_onnx`) and refuses, naming every part and op, a stage cut
that MXNet cannot run. The check reads a static table of MXNet's ops, so it needs no MXNet here.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from functions.backends import check_backend
from partitioner.errors import UnsupportedByBackend

__all__ = ["parts_for_backend"]


def parts_for_backend(files: Mapping[str, onnx.ModelProto], backend: str) -> dict[str, onnx.ModelProto]:
    """``files`` (bundle path -> part model) as ``backend`` runs them; new models, the inputs untouched.

    Raises :class:`UnsupportedByBackend` listing every part that uses something the backend lacks.
    """
    if check_backend(backend) == "onnxruntime":
        return dict(files)
    from functions.backends.mxnet_onnx import MXNetIncompatible, mxnet_problems, to_mxnet_onnx

    problems = [p for rel, model in sorted(files.items()) for p in mxnet_problems(model, where=rel)]
    if problems:
        raise UnsupportedByBackend(
            f"the {backend} backend cannot run {len({p.split(':', 1)[0] for p in problems})} part(s):\n  "
            + "\n  ".join(problems)
            + f"\nExport for onnxruntime (drop --backend {backend}), or cut the model so that these ops stay "
              f"out of it; MXNet 1.9's importer translates only the ops in "
              f"functions.backends.mxnet_onnx.MXNET_ONNX_OPS"
        )
    out: dict[str, onnx.ModelProto] = {}
    for rel, model in files.items():
        try:
            out[rel] = to_mxnet_onnx(model)
        except MXNetIncompatible as e:
            raise UnsupportedByBackend(f"the {backend} backend cannot run {rel}: {e}") from e
    return out
