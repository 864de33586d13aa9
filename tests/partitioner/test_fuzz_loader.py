"""Fuzzing the ONNX loader: mutated protobufs, truncated files, absurd shapes, cyclic graphs.

Whatever the bytes, ``LayerGraph.load`` either gives a graph or raises one of flatpack's own errors
(``ModelError`` and friends, all ``ValueError``s naming the problem), never anything else, never a hang;
`flatpack inspect` on such a file exits non-zero with a one-line error and no traceback. The budgets are
small (tens of examples, a deadline per example) so this runs in CI in a few seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from partitioner.errors import ModelError, NotSplittable, SpecError
from partitioner.graph import LayerGraph
from tests.onnx_builders import conv_stack, mlp

CLEAN = (ModelError, SpecError, NotSplittable)
FUZZ = settings(max_examples=int(os.environ.get("FLATPACK_FUZZ_EXAMPLES", "25")), deadline=5000,
                derandomize=not os.environ.get("FLATPACK_FUZZ_EXAMPLES"),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_CNN = conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4},
                   {"op": "MaxPool", "k": (2, 2), "s": (2, 2)}], cin=3, h=8, w=8)
_VALID = _CNN.SerializeToString()


def _load(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    try:
        LayerGraph.load(path)
    except CLEAN as e:
        msg = str(e)
        assert msg and len(msg) < 2000, msg


@FUZZ
@given(cut=st.integers(min_value=0, max_value=len(_VALID) - 1))
def test_truncated_files(tmp_path: Path, cut: int) -> None:
    _load(tmp_path, _VALID[:cut])


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_protobuf_bytes(tmp_path: Path, edits: list[tuple[int, int]]) -> None:
    data = bytearray(_VALID)
    for at, value in edits:
        data[at] = value
    _load(tmp_path, bytes(data))


@FUZZ
@given(data=st.binary(max_size=512))
def test_random_bytes(tmp_path: Path, data: bytes) -> None:
    _load(tmp_path, data)


@FUZZ
@given(dims=st.lists(st.one_of(st.integers(-3, 4), st.just(2**31), st.just(2**40), st.just(2**62)),
                     min_size=0, max_size=6))
def test_absurd_input_shapes(tmp_path: Path, dims: list[int]) -> None:
    m = mlp()
    shape = m.graph.input[0].type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = d
    _load(tmp_path, m.SerializeToString())


@FUZZ
@given(fields=st.lists(st.sampled_from(["opset", "no_nodes", "bad_op", "dangling", "dup_output", "weights_shape",
                                        "huge_constant", "no_output"]), min_size=1, max_size=3, unique=True))
def test_broken_graphs(tmp_path: Path, fields: list[str]) -> None:
    m = mlp()
    g = m.graph
    for f in fields:
        if f == "opset":
            m.opset_import[0].version = 7
        elif f == "no_nodes":
            del g.node[:]
        elif f == "bad_op" and g.node:
            g.node[0].op_type = "NoSuchOp"
        elif f == "dangling" and g.node:
            g.node[-1].input[0] = "nowhere"
        elif f == "dup_output" and len(g.node) > 1:
            g.node[1].output[0] = g.node[0].output[0]
        elif f == "weights_shape" and g.initializer:
            w = numpy_helper.to_array(g.initializer[0])
            g.initializer[0].CopyFrom(numpy_helper.from_array(w.reshape(-1)[:-1].copy(), g.initializer[0].name))
        elif f == "huge_constant":
            # a ConstantOfShape asking for 2**40 elements: must not be materialised while folding
            shape = numpy_helper.from_array(np.array([2**20, 2**20], np.int64), "big_shape")
            g.initializer.append(shape)
            g.node.append(helper.make_node("ConstantOfShape", ["big_shape"], ["big"]))
            g.output.append(helper.make_tensor_value_info("big", TensorProto.FLOAT, None))
        elif f == "no_output":
            del g.output[:]
    _load(tmp_path, m.SerializeToString())


def _cyclic() -> onnx.ModelProto:
    """Relu(Add(x, y)) where y is the Relu's own output: a cycle."""
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "cyclic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_cyclic_graph_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "cyclic.onnx"
    onnx.save(_cyclic(), str(path))
    with pytest.raises(CLEAN):
        LayerGraph.load(path)


@pytest.mark.parametrize(("command", "case"), [
    ("inspect", "truncated"), ("inspect", "cyclic"), ("inspect", "absurd"), ("inspect", "directory"),
    ("inspect", "empty"), ("plan", "truncated"), ("plan", "cyclic"), ("export", "absurd"),
])
def test_cli_says_one_line(tmp_path: Path, command: str, case: str) -> None:
    path = tmp_path / f"{case}.onnx"
    if case == "truncated":
        path.write_bytes(_VALID[: len(_VALID) // 2])
    elif case == "cyclic":
        onnx.save(_cyclic(), str(path))
    elif case == "absurd":
        m = mlp()
        m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 2**40
        onnx.save(m, str(path))
    elif case == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"")
    extra = {"inspect": [], "plan": ["--mode", "lo"], "export": ["--stages", "0-:none", "-o", str(tmp_path / "b")]}
    res = subprocess.run([sys.executable, "-m", "serving.cli", command, str(path), *extra[command]],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr
    # progress lines (serving.console.status, where stderr is not a terminal) may come first; then one error
    # line (click puts its usage hint above a usage error's)
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip() and not re.match(r"\[ *\d+\.\d s\] ", ln)]
    assert lines[-1].startswith("Error:") and sum(ln.startswith("Error:") for ln in lines) == 1, res.stderr
    assert len(lines) == 1 or lines[0].startswith("Usage:"), res.stderr
