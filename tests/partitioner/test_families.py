"""Channel, reduction and heads splits: exact, and they really slice the weights."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from functions.plan import Split
from partitioner.errors import NotSplittable
from partitioner.graph import LayerGraph
from partitioner.parts import CutStage
from partitioner.verify import verify_options
from tests.onnx_builders import conv_stack, mlp, residual_block


def _weight_elems(model) -> int:
    return sum(numpy_helper.to_array(t).size for t in model.graph.initializer if t.data_type == 1)


@pytest.mark.parametrize("degree", [2, 3, 5])
def test_channel_split_of_a_conv_slices_weights_and_is_exact(degree: int) -> None:
    lg = LayerGraph.load(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 10},
                                     {"op": "MaxPool", "k": (2, 2), "s": (2, 2)}], cin=3, h=9, w=9))
    cut = CutStage(lg, 0, 0).cut(Split("channel", (degree,)))
    total = sum(_weight_elems(p.model) for p in cut.parts)
    assert total == 10 * 3 * 9 + 10  # each weight lives in exactly one part
    assert [p.output_region[1] for p in cut.parts][0][0] == 0
    report, _ = verify_options(lg, [(0, 0, Split("channel", (degree,)))])
    assert report.checked == 1 and report.failed == 0 and report.max_rel_err <= 1e-5


def test_depthwise_channel_split_keeps_groups_consistent() -> None:
    lg = LayerGraph.load(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8, "group": 4}],
                                    cin=4, h=7, w=7))
    report, results = verify_options(lg, [(0, 0, Split("channel", (3,))), (0, 0, Split("channel", (4,)))])
    assert all(r.rel_err is not None for r in results) and report.failed == 0


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_reduction_split_sums_partials_and_adds_bias_once(degree: int) -> None:
    lg = LayerGraph.load(mlp())
    cut = CutStage(lg, 0, 0).cut(Split("reduction", (degree,)))
    assert cut.join == "sum" and cut.epilogue is not None  # Gemm's beta*C is added once, after the sum
    assert all(len(p.model.graph.initializer) >= 1 for p in cut.parts)
    report, _ = verify_options(lg, [(0, 0, Split("reduction", (degree,))), (1, 1, Split("reduction", (degree,)))])
    assert report.checked == 2 and report.failed == 0 and report.max_rel_err <= 1e-5


def test_megatron_mlp_group_channel_then_reduction_with_one_join() -> None:
    lg = LayerGraph.load(mlp(d_in=8, hidden=12, d_out=4))
    cut = CutStage(lg, 0, 1).cut(Split("reduction", (3,)))
    # each part holds a column slice of the first GEMM and a row slice of the second
    assert sum(_weight_elems(p.model) for p in cut.parts) == 12 * 8 + 12 + 12 * 4
    report, _ = verify_options(lg, [(0, 1, Split("reduction", (3,)))])
    assert report.failed == 0 and report.max_rel_err <= 1e-5


def test_channel_split_of_a_residual_block_is_not_admissible() -> None:
    lg = LayerGraph.load(residual_block())
    with pytest.raises(NotSplittable, match="computed whole"):
        CutStage(lg, 1, 1).cut(Split("channel", (2,)))
    report, results = verify_options(lg, [(1, 1, Split("spatial", (3, 2))), (1, 1, Split("reduction", (2,)))])
    assert all(r.rel_err is not None for r in results) and report.failed == 0


def test_heads_split_of_attention_is_exact_and_aligned_to_heads() -> None:
    pytest.importorskip("zoo.builder")
    import zoo
    lg = LayerGraph.load(zoo.build("bert", layers=1, hidden=32, heads=4, seq_len=8))
    att = next(u.index for u in lg.units if "Softmax" in [lg.nodes[i].op_type for i in u.nodes])
    cs = CutStage(lg, att, att)
    assert cs.family_of_reduction() == "heads"
    k, align = cs.reduction_axis(cs.reduction_op())
    assert (k, align) == (32, 8)
    with pytest.raises(NotSplittable):
        cs.cut(Split("heads", (5,)))  # 4 heads cannot feed 5 parts
    report, _ = verify_options(lg, [(att, att, Split("heads", (d,))) for d in (2, 3, 4)])
    assert report.checked == 3 and report.failed == 0 and report.max_rel_err <= 1e-4


def test_bad_grid_is_not_admissible_with_a_reason() -> None:
    lg = LayerGraph.load(mlp())
    with pytest.raises(NotSplittable):
        CutStage(lg, 1, 1).cut(Split("channel", (7,)))  # 6 output features
    assert np.isfinite(1.0)
