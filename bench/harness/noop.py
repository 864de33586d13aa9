"""A function that does (almost) nothing, to time a platform's invoke path: x[1, 4] -> Relu -> y."""

from __future__ import annotations

from pathlib import Path

__all__ = ["noop_bundle", "noop_model"]


def noop_model(out: Path) -> Path:
    """``out/noop.onnx``: the one-node model."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "noop",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    out.mkdir(parents=True, exist_ok=True)
    path = out / "noop.onnx"
    onnx.save(m, str(path))
    return path


def noop_bundle(out: Path, *, master_mb: int = 1769) -> Path:
    """``out/bundle``: the no-op model as one master function of ``master_mb`` (its source in ``out/noop.onnx``)."""
    from partitioner.export import export_bundle

    return export_bundle(noop_model(out), "0-:none", out / "bundle", master_mb=master_mb)
