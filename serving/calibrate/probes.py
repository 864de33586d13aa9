"""The probe functions `flatpack calibrate` deploys: tiny one-part bundles written without the partitioner.

* ``noop``: x[1, 4] -> Relu -> y. Its round trip is the platform's invoke latency; the meter's duration
  of one invocation is what the platform bills beyond the work itself.
* ``echo`` of N bytes: x[1, N/4] float32 -> Identity -> y. The tensor travels in and back out through the
  deployment's transport (or inline), so its round trip beyond the no-op's is four transfers by reference
  (the caller's put, the master's get, the master's put, the caller's get) or two inline.
* ``compute``: a chain of n x n MatMuls sharing one orthogonal weight (numerically tame): fixed work whose
  time at two memory sizes is the CPU share's slow-down.
* ``fork`` of n parts: a small convolution split into n spatial tiles that n workers run while the master
  only sends and joins (:func:`write_fork_bundle`, cut by the partitioner as ``flatpack export`` cuts a
  model). The master's CPU per request grows with n by its CPU per worker invocation.

Each other bundle is one stage whose one part the master runs, with plan.json, manifest.json and source.onnx as
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

__all__ = ["FORK_SPLITS", "compute_model", "echo_model", "fork_model", "noop_model", "tensors_model",
           "write_fork_bundle",
           "write_probe_bundle"]

#: the fork probe's splits by worker count
FORK_SPLITS = {2: "spatial=2x1", 4: "spatial=2x2"}

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


def tensors_model(k: int) -> onnx.ModelProto:
    """``k`` inputs x0..x{k-1} [1, 4] -> Relu each -> ``k`` outputs y0..y{k-1}: a no-op that moves ``k``
    tensors each way (``k`` 1: :func:`noop_model` with its tensors renamed)."""
    if k < 1:
        raise ValueError(f"a tensors probe moves at least one tensor each way, not {k}")
    graph = helper.make_graph(
        [helper.make_node("Relu", [f"x{i}"], [f"y{i}"]) for i in range(k)], f"tensors{k}",
        [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, 4]) for i in range(k)],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 4]) for i in range(k)],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    m.ir_version = _IR_VERSION
    onnx.checker.check_model(m)
    return m


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


def fork_model(channels: int = 8, size: int = 32) -> onnx.ModelProto:
    """x[1, c, s, s] -> 3x3 Conv (c -> c, padded) -> Relu -> y: little work, split into spatial tiles."""
    w = np.random.default_rng(0).standard_normal((channels, channels, 3, 3)).astype(np.float32) / (3 * channels)
    nodes = [helper.make_node("Conv", ["x", "w"], ["t"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["t"], ["y"])]
    shape = (1, channels, size, size)
    return _model(f"fork{channels}x{size}", nodes, shape, shape, {"w": w})


def write_fork_bundle(root: Path, model: onnx.ModelProto, parts: int, *, memory_mb: int) -> Path:
    """``root`` as a bundle of ``model`` split into ``parts`` tiles (:data:`FORK_SPLITS`), each run by a worker
    function of ``memory_mb`` while the master (``memory_mb`` too) sends and joins (replaced if it exists)."""
    from partitioner.export import Placement, export_bundle

    if parts not in FORK_SPLITS:
        raise ValueError(f"a fork probe has {sorted(FORK_SPLITS)} parts, not {parts}")
    return export_bundle(model, f"0-:{FORK_SPLITS[parts]}", root, placements=[Placement(False, memory_mb)],
                         master_mb=memory_mb)


def _shape(v: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(int(d.dim_value) for d in v.type.tensor_type.shape.dim)


def write_probe_bundle(root: Path, model: onnx.ModelProto, *, memory_mb: int) -> Path:
    """``root`` as a bundle of ``model`` run whole by one master function of ``memory_mb`` (replaced if
    it exists). The model's inputs and outputs are float32 (one each, ``x`` and ``y``, but for
    :func:`tensors_model`)."""
    if root.exists():
        shutil.rmtree(root)
    (root / "parts").mkdir(parents=True)
    g = model.graph
    xs = tuple(TensorSpec(x.name, "float32", _shape(x)) for x in g.input)
    ys = tuple(TensorSpec(y.name, "float32", _shape(y)) for y in g.output)
    onnx.save(model, str(root / "source.onnx"))
    onnx.save(model, str(root / "parts" / "s00_p00.onnx"))
    part = Part(0, "master", "parts/s00_p00.onnx", tuple(PartInput(x.name, full_region(x.shape)) for x in xs),
                tuple(y.name for y in ys))
    stage = Stage(0, (0, 0), Split(), tuple(x.name for x in xs), ys, (part,))
    digest = hashlib.sha256(model.SerializeToString()).hexdigest()
    plan = Plan(ModelInfo(g.name, digest, xs, ys), (Function("master", memory_mb),), (stage,),
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
