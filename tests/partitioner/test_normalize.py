"""Normalisation: folding to a fixpoint, and fixing dynamic input dimensions by name (``--dim``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import partitioner.normalize as normalize
from partitioner.errors import ModelError
from partitioner.graph import LayerGraph
from partitioner.normalize import ShapeFixes, fixed_dims, parse_dims
from tests.onnx_builders import make_model, mlp, shared_seq


def _range_over_a_reshaped_shape() -> object:
    """Range(0, y.shape[2]) where y = Reshape(x, [1, 2, width / 2]): shape inference does not propagate the
    Div, so y's shape, and so the Range's, are only known once a first fold made the Reshape's target constant."""
    return make_model(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "one"], ["width"], axis=0),
         helper.make_node("Div", ["width", "two"], ["half"]),
         helper.make_node("Unsqueeze", ["half", "ax"], ["half1"]),
         helper.make_node("Concat", ["lead", "half1"], ["target"], axis=0),
         helper.make_node("Reshape", ["x", "target"], ["y"]),
         helper.make_node("Shape", ["y"], ["ys"]),
         helper.make_node("Gather", ["ys", "two"], ["n"], axis=0),
         helper.make_node("Range", ["zero", "n", "one"], ["r"]),
         helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["y", "rf"], ["output"])],
        [("x", (1, 6))], ["output"],
        {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "two": np.array(2, np.int64),
         "ax": np.array([0], np.int64), "lead": np.array([1, 2], np.int64)},
    )


def test_folding_repeats_until_nothing_changes() -> None:
    lg = LayerGraph.load(_range_over_a_reshaped_shape())
    assert [n.op_type for n in lg.nodes] == ["Reshape", "Add"]
    assert lg.tensors["output"].shape == (1, 2, 3)
    np.testing.assert_array_equal(lg.initializer("rf"), [0.0, 1.0, 2.0])


def test_folding_that_does_not_settle_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(normalize, "MAX_FOLD_ROUNDS", 1)  # this model needs two
    with pytest.raises(ModelError, match=r"constant folding did not settle: 1 rounds .* still folded 5 tensors"):
        LayerGraph.load(_range_over_a_reshaped_shape())


def test_dim_fixes_a_symbolic_dimension_in_every_input_and_is_recorded() -> None:
    lg = LayerGraph.load(shared_seq(), dims={"seq": 8})
    assert lg.tensors["a"].shape == lg.tensors["b"].shape == (1, 8, 4)
    assert lg.tensors["output"].shape == (1, 8, 4)
    assert fixed_dims(lg.model) == {"batch": 1, "seq": 8}  # batch by default
    lg = LayerGraph.load(shared_seq(), {"a": (2, 8, 4)}, {"batch": 2, "seq": 8})
    assert lg.tensors["b"].shape == (2, 8, 4) and fixed_dims(lg.model) == {"batch": 2, "seq": 8}
    assert fixed_dims(LayerGraph.load(mlp()).model) == {}


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ModelError) as e:
        LayerGraph.load(shared_seq())
    assert str(e.value) == ("dynamic input dimensions are not fixed: 'seq' (a axis 1, b axis 1); pass --dim seq=N "
                            "(or per input: --input-shape a=1xNx4 --input-shape b=1xNx4)")
    with pytest.raises(ModelError) as e:
        LayerGraph.load(shared_seq(), {"nope": (1, 2)}, {"sequence": 8})
    message = str(e.value)
    assert "\n" not in message
    for part in ("--input-shape names unknown input(s) ['nope']", "--dim sequence: no input has such a dimension "
                 "(the inputs' symbolic dimensions: batch, seq)", "'seq' (a axis 1, b axis 1)", "--dim seq=N"):
        assert part in message
    with pytest.raises(ModelError, match=r"gives 'seq' different sizes \(4 in b, 8 in a\)"):
        LayerGraph.load(shared_seq(), {"a": (1, 8, 4), "b": (1, 4, 4)})
    with pytest.raises(ModelError, match=r"--input-shape a gives 'seq' as 4 but --dim seq=8"):
        LayerGraph.load(shared_seq(), {"a": (1, 4, 4)}, {"seq": 8})


def test_an_unnamed_dimension_is_fixed_per_input() -> None:
    m = shared_seq()
    m.graph.input[1].type.tensor_type.shape.dim[2].Clear()
    with pytest.raises(ModelError, match=r"unnamed \(b axis 2\); pass --dim seq=N --input-shape b=1xNxN$"):
        LayerGraph.load(m)


def test_dim_and_shape_specs_are_parsed_or_refused() -> None:
    assert parse_dims(["batch=1", " seq=128"]) == {"batch": 1, "seq": 128}
    assert ShapeFixes.parse(["a=1x8x4"], ["seq=8"]) == ShapeFixes({"a": (1, 8, 4)}, {"seq": 8})
    for bad, why in (("seq", "NAME=SIZE"), ("=3", "NAME=SIZE"), ("seq=x", "NAME=SIZE"), ("seq=0", "at least 1")):
        with pytest.raises(ModelError, match=why):
            parse_dims([bad])
    with pytest.raises(ModelError, match="given twice"):
        parse_dims(["seq=8", "seq=16"])


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same tiny encoder exported with dynamic batch/seq axes and with static shapes (seq 32)."""
    pytest.importorskip("torch")
    from tests.dynamic_encoder import export_encoder

    d = tmp_path_factory.mktemp("encoder")
    return export_encoder(d / "dynamic.onnx"), export_encoder(d / "static.onnx", dynamic=False)


def test_a_dynamic_axes_export_loads_into_the_static_export_graph(encoders: tuple[Path, Path]) -> None:
    dynamic, static = encoders
    lg = LayerGraph.load(dynamic, dims={"batch": 1, "seq": 32})
    want = LayerGraph.load(static)
    assert Counter(n.op_type for n in lg.nodes) == Counter(n.op_type for n in want.nodes)
    assert len(lg.units) == len(want.units)
    assert [u.ops for u in lg.units] == [u.ops for u in want.units]
    used = {x for n in lg.nodes for x in (*n.input, *n.output) if x}
    assert used <= set(lg.tensors)  # a static shape for every tensor
    assert all(lg.tensors[x].shape == (1, 32) for x in lg.inputs)
    assert fixed_dims(lg.model) == {"batch": 1, "seq": 32}


def test_a_dynamic_axes_export_names_every_missing_dim(encoders: tuple[Path, Path]) -> None:
    with pytest.raises(ModelError) as e:
        LayerGraph.load(encoders[0])
    assert "'seq' (input_ids axis 1, attention_mask axis 1, token_type_ids axis 1); pass --dim seq=N" in str(e.value)
