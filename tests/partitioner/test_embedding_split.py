"""The embedding split family: rows of the embedding tables sharded across parts, indices masked per
shard, partial lookups joined by a sum (partitioner.embedding).

Each check runs the split stage on onnxruntime and compares with the unsplit model, on random indices
and on indices at every shard's boundaries (first and last row of each range, and the rows either side),
plus a negative index (Gather counts it from the table's end)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from functions.executor import InProcessRunner, join_stage, part_inputs
from functions.plan import Split
from partitioner.embedding import is_row_lookup
from partitioner.errors import NotSplittable
from partitioner.export import stage_record, write_stage_files
from partitioner.graph import LayerGraph
from partitioner.options import unit_families
from partitioner.parts import CutStage
from partitioner.regions import even_ranges
from partitioner.spec import parse_split
from partitioner.verify import candidate_options, reference_tensors, verify_options

ROWS, DIM, BAG = 1000, 8, 6


def _gather_model(*, bag_reduce: str | None = "ReduceSum", table_dtype: type = np.float32,
                  index_dtype: int = TensorProto.INT64, then: str = "MatMul", rows: int = ROWS) -> onnx.ModelProto:
    """idx [2, BAG] -> Gather(table [rows, DIM]) -> (bag reduce) -> (MatMul) -> y."""
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((rows, DIM)) * 100).astype(table_dtype) if table_dtype != np.int64 else \
        rng.integers(-1000, 1000, (rows, DIM)).astype(np.int64)
    nodes = [helper.make_node("Gather", ["table", "idx"], ["e"], axis=0, name="lookup")]
    inits = {"table": table, "axes": np.array([1], np.int64), "w": rng.standard_normal((DIM, 4)).astype(np.float32)}
    x = "e"
    if bag_reduce:
        # opset 17: ReduceSum takes its axes as an input, ReduceMean as an attribute
        nodes.append(helper.make_node("ReduceSum", ["e", "axes"], ["bag"], keepdims=0, name="bag")
                     if bag_reduce == "ReduceSum" else
                     helper.make_node(bag_reduce, ["e"], ["bag"], keepdims=0, axes=[1], name="bag"))
        x = "bag"
    out_type = TensorProto.INT64 if table_dtype == np.int64 else TensorProto.FLOAT
    if then == "MatMul":
        nodes.append(helper.make_node("MatMul", [x, "w"], ["y"], name="mlp"))
    else:
        nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    graph = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("idx", index_dtype, [2, BAG])],
                              [helper.make_tensor_value_info("y", out_type, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _boundary_indices(rows: int, degree: int, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Indices at the edges of every shard of ``rows`` in ``degree`` ranges (and -1), tiled to ``shape``."""
    edges: list[int] = [-1]
    for lo, hi in even_ranges(rows, degree):
        edges += [lo, hi - 1, max(0, lo - 1), min(rows - 1, hi)]
    flat = np.resize(np.array(edges, dtype), int(np.prod(shape)))
    return flat.reshape(shape)


def _run_stage(lg: LayerGraph, first: int, last: int, split: Split, inputs: dict[str, np.ndarray]
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The stage's outputs split (as the master would join them) and unsplit (the reference)."""
    env = reference_tensors(lg, inputs)
    cut = CutStage(lg, first, last).cut(split)
    with tempfile.TemporaryDirectory() as tmp:
        stage, files = stage_record(cut, 0)
        write_stage_files(Path(tmp), files)
        runner = InProcessRunner(Path(tmp))
        outs = join_stage(stage, runner.run_stage(stage, [part_inputs(p, env) for p in stage.parts]))
        if stage.epilogue is not None:
            outs.update(runner.run_epilogue(stage, {**env, **outs}))
        return {o.name: outs[o.name] for o in stage.outputs}, {o.name: env[o.name] for o in stage.outputs}


def _lookup_unit(lg: LayerGraph) -> int:
    return next(u.index for u in lg.units if any(is_row_lookup(lg, i) for i in u.nodes))


@pytest.mark.parametrize("degree", [2, 3, 4, 7])
@pytest.mark.parametrize("bag_reduce", [None, "ReduceSum", "ReduceMean"])
def test_a_lookup_split_by_rows_equals_the_whole_at_shard_boundaries(degree: int, bag_reduce: str | None) -> None:
    lg = LayerGraph.load(_gather_model(bag_reduce=bag_reduce))
    u = _lookup_unit(lg)
    assert "embedding" in unit_families(lg, u)
    idx = _boundary_indices(ROWS, degree, (2, BAG), np.int64)
    got, want = _run_stage(lg, u, u, Split("embedding", (degree,)), {"idx": idx})
    for name, w in want.items():
        if bag_reduce is None:  # one row per index, zeros from every other part: exact
            np.testing.assert_array_equal(got[name], w)
        else:  # the bag's rows are added in another order
            np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-4)


def test_integer_tables_and_int32_indices_split_exactly() -> None:
    rows = 10_000  # an integer table is an embedding from 64 Ki elements (LayerGraph.is_heavy)
    lg = LayerGraph.load(_gather_model(table_dtype=np.int64, index_dtype=TensorProto.INT32, then="Identity",
                                       rows=rows))
    u = _lookup_unit(lg)
    idx = _boundary_indices(rows, 3, (2, BAG), np.int32)
    got, want = _run_stage(lg, u, u, Split("embedding", (3,)), {"idx": idx})
    for name, w in want.items():
        assert got[name].dtype == w.dtype
        np.testing.assert_array_equal(got[name], w)


def test_each_part_holds_only_its_rows() -> None:
    lg = LayerGraph.load(_gather_model())
    u = _lookup_unit(lg)
    cut = CutStage(lg, u, u).cut(Split("embedding", (4,)))
    assert cut.join == "sum" and len(cut.parts) == 4
    for part, (lo, hi) in zip(cut.parts, even_ranges(ROWS, 4), strict=True):
        tables = [t for t in part.model.graph.initializer if len(t.dims) == 2 and t.dims[1] == DIM]
        # its rows, and a row of zeros that an index outside them looks up
        assert [tuple(t.dims) for t in tables] == [(hi - lo + 1, DIM)]
        rows = numpy_helper.to_array(tables[0])
        np.testing.assert_array_equal(rows[:-1], lg.initializer("table")[lo:hi])
        assert not rows[-1].any()
    costs = CutStage(lg, u, u).costs(Split("embedding", (4,)))
    # its rows of the table and the row of zeros, and the ReduceSum's axes (8 bytes)
    assert [c.weight_bytes for c in costs] == [(hi - lo + 1) * DIM * 4 + 8 for lo, hi in even_ranges(ROWS, 4)]


def test_more_parts_than_rows_and_stages_without_lookups_are_refused() -> None:
    lg = LayerGraph.load(_gather_model())
    u = _lookup_unit(lg)
    with pytest.raises(NotSplittable, match="rows"):
        CutStage(lg, u, u).check(Split("embedding", (ROWS + 1,)))
    others = [v.index for v in lg.units if v.index != u]
    for v in others:
        with pytest.raises(NotSplittable):
            CutStage(lg, v, v).check(Split("embedding", (2,)))


def test_a_lookup_added_to_something_else_is_not_summed_twice() -> None:
    """Add(lookup, dense) is not linear in the lookup: the dense term would be added once per part. The
    join is the lookup, and the Add is the epilogue's."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Gather", ["table", "idx"], ["e"], axis=0),
             helper.make_node("Add", ["e", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 5]),
                                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, DIM])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.standard_normal((ROWS, DIM)).astype(np.float32), "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    lg = LayerGraph.load(model)
    u = _lookup_unit(lg)
    cut = CutStage(lg, u, u).cut(Split("embedding", (2,)))
    assert cut.epilogue is not None and cut.joined is not None and cut.joined.name.startswith("e")
    idx = _boundary_indices(ROWS, 2, (1, 5), np.int64)
    got, want = _run_stage(lg, u, u, Split("embedding", (2,)),
                           {"idx": idx, "x": rng.standard_normal((1, 5, DIM)).astype(np.float32)})
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)


def test_the_split_is_written_and_parsed_as_embedding_n() -> None:
    assert parse_split("embedding", "3") == Split("embedding", (3,))
    assert str(Split("embedding", (3,))) == "embedding=3"


@pytest.fixture(scope="module")
def tiny_dlrm() -> LayerGraph:
    pytest.importorskip("torch")
    from zoo import build

    return LayerGraph.load(build("dlrm", vocab=3000, hidden=16, layers=3, seq_len=4, width_div=8))


def test_the_tiny_dlrm_verifies_with_every_option_including_embedding(tiny_dlrm: LayerGraph) -> None:
    options = candidate_options(tiny_dlrm)
    assert {str(s) for _, _, s in options if s.family == "embedding"} == {"embedding=2", "embedding=3", "embedding=4"}
    report, results = verify_options(tiny_dlrm, options)
    assert report.checked > 0 and report.failed == 0, report.failures
    checked = [r for r in results if r.split.family == "embedding" and r.rel_err is not None]
    assert len(checked) == 3


@pytest.mark.parametrize("degree", [2, 4])
def test_the_tiny_dlrm_embedding_unit_at_shard_boundaries(tiny_dlrm: LayerGraph, degree: int) -> None:
    lg = tiny_dlrm
    u = _lookup_unit(lg)
    lookups = [i for i in lg.units[u].nodes if is_row_lookup(lg, i)]
    assert len(lookups) == 3  # every table in the one unit, all sharded together
    rng = np.random.default_rng(2)
    inputs = {"dense": rng.random((1, 13)).astype(np.float32)}
    inputs |= {f"sparse_{i}": _boundary_indices(3000, degree, (1, 4), np.int64)[:, ::-1].copy() for i in range(3)}
    got, want = _run_stage(lg, u, u, Split("embedding", (degree,)), inputs)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-6)
    # each part reads the three index tensors, one after another (the dense features join on the master)
    assert [c.input_tensors for c in CutStage(lg, u, u).costs(Split("embedding", (degree,)))] == [3] * degree
