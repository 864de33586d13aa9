"""The DLRM recommender: its graph, its tables' share of its bytes, and an external-data file loaded and
split by rows (the full model's 2 GB of tables are written the same way, above the protobuf limit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")

from functions.plan import Split  # noqa: E402
from partitioner.embedding import is_row_lookup  # noqa: E402
from partitioner.graph import LayerGraph  # noqa: E402
from partitioner.model_file import save_model  # noqa: E402
from partitioner.verify import verify_options  # noqa: E402
from zoo import build, lookup  # noqa: E402

TINY = {"vocab": 2000, "hidden": 8, "layers": 2, "seq_len": 3, "width_div": 16}


def test_the_catalogue_entry_and_its_defaults() -> None:
    e = lookup("dlrm")
    assert e.family == "dlrm" and set(e.options) == {"layers", "vocab", "hidden", "seq_len", "input_size"}
    assert e.default("input_size") == 1  # one candidate per request unless asked
    tables_bytes = e.default("layers") * e.default("vocab") * e.default("hidden") * 4
    assert 1e9 <= tables_bytes <= 3e9  # 1-3 GB of tables: external data on disk


def test_a_tiny_dlrm_is_lookups_in_bags_and_small_mlps() -> None:
    model = build("dlrm", **TINY)
    assert [i.name for i in model.graph.input] == ["dense", "sparse_0", "sparse_1"]
    assert [o.name for o in model.graph.output] == ["output"]
    lg = LayerGraph.load(model)
    lookups = [i for i in range(len(lg.nodes)) if is_row_lookup(lg, i)]
    assert len(lookups) == 2
    table_bytes = sum(lg.tensors[lg.nodes[i].input[0]].nbytes for i in lookups)
    all_bytes = sum(lg.tensors[t.name].nbytes for t in lg.model.graph.initializer)
    assert table_bytes / all_bytes > 0.5  # memory is the tables'
    (unit,) = [u for u in lg.units if set(u.nodes) & set(lookups)]
    assert set(lookups) <= set(unit.nodes)  # every table in one unit: one embedding split shards them all


def test_an_external_data_model_loads_and_its_embedding_split_verifies(tmp_path: Path) -> None:
    path = save_model(build("dlrm", **TINY), tmp_path / "dlrm.onnx", threshold_bytes=1)
    assert (tmp_path / "dlrm.onnx.data").is_file()
    assert any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(str(path), load_external_data=False).graph.initializer)
    lg = LayerGraph.load(path)
    u = next(u.index for u in lg.units if any(is_row_lookup(lg, i) for i in u.nodes))
    report, results = verify_options(lg, [(u, u, Split("embedding", (d,))) for d in (2, 3)])
    assert report.checked == 2 and report.failed == 0, report.failures
    assert all(r.rel_err is not None and np.isfinite(r.rel_err) for r in results)


def test_a_ranking_request_scores_input_size_candidates_and_its_embedding_split_verifies() -> None:
    """``input_size`` is the batch of candidates a request scores: every input and the output carry it, and
    the row-sharded lookups of a batch still sum to the unsplit model's."""
    model = build("dlrm", **TINY, input_size=5)
    values = [*model.graph.input, *model.graph.output]
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}
    assert dims == {"dense": [5, 13], "sparse_0": [5, 3], "sparse_1": [5, 3], "output": [5, 1]}
    lg = LayerGraph.load(model)
    u = next(u.index for u in lg.units if any(is_row_lookup(lg, i) for i in u.nodes))
    report, _ = verify_options(lg, [(u, u, Split("embedding", (2,)))])
    assert report.checked == 1 and report.failed == 0, report.failures
