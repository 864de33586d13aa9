"""The probe functions `flatpack calibrate` deploys: tiny one-part bundles written without the partitioner.

* ``noop``: x[1, 4] -> Relu -> y. Its round trip is the platform's invoke latency; the meter's duration
  of one invocation is what the platform bills beyond the work itself.
* ``echo`` of N bytes: x[1, N/4] float32 -> Identity -> y. The tensor travels in and back out through the
  deployment's transport (or inline), so its round trip beyond the no-op's is four transfers by reference
  (the caller's put, the master's get, the master's put, the caller's get) or two inline.
* ``compute``: a chain of n x n MatMuls sharing one orthogonal weight (numerically tame): fixed work whose
  time at two memory sizes is the CPU share's slow-down.

Each bundle is one stage whose one part the master runs, with plan.json, manifest.json and source.onnx as
``flatpack export`` writes them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from functions.bundle import MANIFEST_SCHEMA, sha256_file
from functions.plan import Function, ModelInfo, Part, PartInput, Plan, Split, Stage, TensorSpec, full_region

__all__ = ["compute_model", "echo_model", "noop_model", "write_probe_bundle"]

_OPSET = 17
_IR_VERSION = 8  # what onnxruntime 1.18 and later all read


def _model(name: str, nodes: list[onnx.NodeProto], x_shape: tuple[int, ...], y_shape: tuple[int, ...],
           inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
        initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    m.ir_version = _IR_VERSION
    onnx.checker.check_model(m)
    return m


def noop_model() -> onnx.ModelProto:
    """x[1, 4] -> Relu -> y: as little work as a function can do."""
    return _model("noop", [helper.make_node("Relu", ["x"], ["y"])], (1, 4), (1, 4))


def echo_model(nbytes: int) -> onnx.ModelProto:
    """x[1, nbytes / 4] float32 -> Identity -> y: the input back, to time moving ``nbytes`` each way."""
    if nbytes < 4 or nbytes % 4:
        raise ValueError(f"an echo probe moves float32 tensors: {nbytes} bytes is not a positive multiple of 4")
    n = nbytes // 4
    return _model(f"echo{nbytes}", [helper.make_node("Identity", ["x"], ["y"])], (1, n), (1, n))


def compute_model(n: int = 256, layers: int = 16) -> onnx.ModelProto:
    """x[n, n] -> ``layers`` MatMuls by one orthogonal n x n weight -> y: 2 n^3 ``layers`` FLOPs of work
    that does not depend on the input's values and keeps them bounded."""
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((n, n)))
    nodes, prev = [], "x"
    for i in range(layers):
        out = "y" if i == layers - 1 else f"t{i}"
        nodes.append(helper.make_node("MatMul", [prev, "w"], [out]))
        prev = out
    return _model(f"compute{n}x{layers}", nodes, (n, n), (n, n), {"w": q.astype(np.float32)})


def _shape(v: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(int(d.dim_value) for d in v.type.tensor_type.shape.dim)


def write_probe_bundle(root: Path, model: onnx.ModelProto, *, memory_mb: int) -> Path:
    """``root`` as a bundle of ``model`` run whole by one master function of ``memory_mb`` (replaced if
    it exists). The model has one float32 input ``x`` and one output ``y``."""
    if root.exists():
        shutil.rmtree(root)
    (root / "parts").mkdir(parents=True)
    g = model.graph
    x, y = g.input[0], g.output[0]
    xs = TensorSpec(x.name, "float32", _shape(x))
    ys = TensorSpec(y.name, "float32", _shape(y))
    onnx.save(model, str(root / "source.onnx"))
    onnx.save(model, str(root / "parts" / "s00_p00.onnx"))
    part = Part(0, "master", "parts/s00_p00.onnx", (PartInput(xs.name, full_region(xs.shape)),), (ys.name,))
    stage = Stage(0, (0, 0), Split(), (xs.name,), (ys,), (part,))
    digest = hashlib.sha256(model.SerializeToString()).hexdigest()
    plan = Plan(ModelInfo(g.name, digest, (xs,), (ys,)), (Function("master", memory_mb),), (stage,),
                mode="calibration-probe")
    plan.validate()
    plan.save(root / "plan.json")
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "source": {"file": None, "sha256": digest},
        "files": {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return root
