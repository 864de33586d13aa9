"""Running parts with MXNet 1.9 (Gillis's serving backend) instead of onnxruntime.

:class:`MXNetSessionCache` has :class:`functions.session.SessionCache`'s interface (``get``,
``input_names``, ``run``), so the worker and master roles run parts without knowing the backend. A part
is read with onnx, rewritten for MXNet's importer (:func:`functions.backends.mxnet_onnx.to_mxnet_onnx`,
a no-op for parts exported with ``--backend mxnet``), imported to an MXNet symbol and bound once to an
executor for the part's fixed input shapes; each run copies the inputs into the bound arrays and runs
forward. MXNet 1.9 needs numpy < 1.24, so this module runs only in the MXNet function environment
(``flatpack backend setup mxnet``), never in flatpack's own.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MXNetPart", "MXNetSessionCache", "load_part"]

log = logging.getLogger(__name__)


@dataclass
class MXNetPart:
    """One part bound to an MXNet executor: inputs and outputs in the ONNX file's names and order."""

    path: Path
    input_names: list[str]
    output_names: list[str]
    output_dtypes: list[np.dtype]
    executor: Any
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.lock:
            args = self.executor.arg_dict
            for name in self.input_names:
                x = np.asarray(inputs[name])
                dst = args[name]
                if tuple(dst.shape) != x.shape:
                    raise ValueError(
                        f"part {self.path.name}: input {name!r} has shape {x.shape}, the part was bound for "
                        f"{tuple(dst.shape)}"
                    )
                dst[:] = x
            outs = self.executor.forward(is_train=False)
            return {
                n: o.asnumpy().astype(dt, copy=False)
                for n, o, dt in zip(self.output_names, outs, self.output_dtypes, strict=True)
            }


def _np_dtype(elem_type: int) -> np.dtype:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def load_part(path: str | Path, *, threads: int = 0) -> MXNetPart:
    """Import the ONNX part at ``path`` into MXNet and bind it for its declared input shapes."""
    if threads > 0:
        # MXNet's operators size their OpenMP pool from this when the library loads
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # one line per bound part about the oneDNN subgraph otherwise
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
    import mxnet as mx
    import onnx

    # GraphProto is what mxnet.contrib.onnx.import_model runs after onnx.load; calling it directly saves
    # writing the rewritten model to a temporary file. MXNet 1.9.1 is the project's last release.
    from mxnet.contrib.onnx.onnx2mx.import_onnx import GraphProto

    from functions.backends.mxnet_onnx import to_mxnet_onnx

    path = Path(path)
    model = to_mxnet_onnx(onnx.load(str(path)))
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    sym, arg_params, aux_params = GraphProto().from_onnx(model.graph, opset)
    params = {t.name for t in model.graph.initializer}
    data = [i for i in model.graph.input if i.name not in params]
    args = dict(arg_params)
    for i in data:
        shape = tuple(d.dim_value for d in i.type.tensor_type.shape.dim)
        if any(d <= 0 for d in shape):
            raise ValueError(f"part {path.name}: input {i.name!r} has a dynamic shape {shape}; parts have fixed shapes")
        args[i.name] = mx.nd.zeros(shape, dtype=_np_dtype(i.type.tensor_type.elem_type))
    wanted = set(sym.list_arguments())
    missing = sorted(wanted - set(args))
    if missing:
        raise ValueError(f"part {path.name}: MXNet's import left argument(s) {missing} without a value")
    executor = sym.bind(mx.cpu(), args={k: v for k, v in args.items() if k in wanted},
                        aux_states=dict(aux_params), grad_req="null")
    outputs = list(model.graph.output)
    if len(executor.outputs) != len(outputs):
        raise ValueError(f"part {path.name}: MXNet made {len(executor.outputs)} outputs of {len(outputs)}")
    part = MXNetPart(path, [i.name for i in data], [o.name for o in outputs],
                     [_np_dtype(o.type.tensor_type.elem_type) for o in outputs], executor)
    # the executor holds its own copies of the weights: drop the proto's and the importer's now
    del model, args, arg_params, aux_params
    gc.collect()
    return part


class MXNetSessionCache:
    """Bound parts keyed by resolved file path; safe to share between threads (one run per part at once)."""

    def __init__(self, *, intra_op_threads: int = 0) -> None:
        self._threads = intra_op_threads
        self._parts: dict[Path, MXNetPart] = {}
        self._lock = threading.Lock()

    def get(self, path: str | Path) -> MXNetPart:
        key = Path(path).resolve()
        with self._lock:
            part = self._parts.get(key)
            if part is None:
                part = load_part(key, threads=self._threads)
                self._parts[key] = part
            return part

    def input_names(self, path: str | Path) -> list[str]:
        return list(self.get(path).input_names)

    def warm_up(self, path: str | Path) -> bool:
        """Run the part once on zeros of the shapes it was bound for (see :class:`functions.session.SessionCache`)."""
        part = self.get(path)
        args = part.executor.arg_dict
        try:
            part.run({n: np.zeros(tuple(args[n].shape), args[n].dtype) for n in part.input_names})
        except Exception:  # noqa: BLE001 - MXNet raises its own untyped errors
            return False
        return True

    def run(self, path: str | Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.get(path).run(inputs)

    def __len__(self) -> int:
        return len(self._parts)
