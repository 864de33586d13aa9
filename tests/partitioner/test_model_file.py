"""partitioner.model_file.save_model: external data above the threshold, and the caller's model untouched."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import partitioner.model_file as model_file
from partitioner.export import export_bundle
from partitioner.graph import LayerGraph
from partitioner.model_file import save_model
from tests.onnx_builders import mlp

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 12)


def _run(model: onnx.ModelProto | str) -> np.ndarray:
    src = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: X})[0]


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t).copy() for t in model.graph.initializer}


def _in_memory(model: onnx.ModelProto) -> bool:
    """Every initializer holds its own bytes (none refers to a file)."""
    return all(t.data_location == onnx.TensorProto.DEFAULT and not t.external_data for t in model.graph.initializer)


def test_small_model_is_one_self_contained_file(tmp_path: Path) -> None:
    model = mlp(d_in=12, hidden=64, d_out=6)
    path = save_model(model, tmp_path / "a" / "m.onnx")
    assert path.is_file() and not path.with_name("m.onnx.data").exists()
    np.testing.assert_array_equal(_run(str(path)), _run(model))


def test_large_model_goes_to_external_data_and_the_callers_model_keeps_its_weights(tmp_path: Path) -> None:
    model = mlp(d_in=12, hidden=64, d_out=6)
    before, want, proto = _weights(model), _run(model), model.SerializeToString()
    path = save_model(model, tmp_path / "m.onnx", threshold_bytes=1000)
    data = path.with_name("m.onnx.data")
    assert data.stat().st_size >= 12 * 64 * 4  # the 12x64 weight went to the side file
    loaded = onnx.load(str(path), load_external_data=False)
    assert not _in_memory(loaded)  # the file on disk refers to its data file
    np.testing.assert_array_equal(_run(str(path)), want)
    # the caller's proto is exactly what it was: its weights in memory, no reference to the file
    assert _in_memory(model) and model.SerializeToString() == proto
    shutil.rmtree(tmp_path)  # the file may go away; the model must not care
    assert {k: v.tobytes() for k, v in _weights(model).items()} == {k: v.tobytes() for k, v in before.items()}
    np.testing.assert_array_equal(_run(model), want)


def test_a_save_that_fails_leaves_the_callers_model_as_it_was(tmp_path: Path) -> None:
    model = mlp(d_in=12, hidden=64, d_out=6)
    proto = model.SerializeToString()
    target = tmp_path / "m.onnx"
    target.mkdir()  # the model file cannot be written (a directory is in the way) after the data file was
    with pytest.raises(OSError):
        save_model(model, target, threshold_bytes=1000)
    assert _in_memory(model) and model.SerializeToString() == proto


def test_exporting_a_big_graph_keeps_the_loaded_graphs_weights(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug this module exists for: export wrote source.onnx with external data and left the loaded
    LayerGraph's weights pointing at a file inside a bundle that may be deleted."""
    monkeypatch.setattr(model_file, "EXTERNAL_DATA_THRESHOLD_BYTES", 1000)
    lg = LayerGraph.load(mlp(d_in=12, hidden=64, d_out=6))
    want = _run(lg.model)
    export_bundle(lg, "0-:none", tmp_path / "bundle")
    assert (tmp_path / "bundle" / "source.onnx.data").is_file()
    shutil.rmtree(tmp_path / "bundle")
    assert _in_memory(lg.model)
    np.testing.assert_array_equal(_run(lg.model), want)


def _over_the_limit(path: Path, rows: int = 525_000, width: int = 1024) -> Path:
    """ids [1, 4] -> Gather(table [rows, width]) -> MatMul -> Relu, the table (2.15 GB at the defaults) written
    to ``<path>.data`` in chunks, so the test never holds it twice."""
    from onnx import TensorProto, helper

    data = path.with_name(path.name + ".data")
    chunk = 1 << 14
    block = np.tile(np.linspace(-1, 1, width, dtype=np.float32), (chunk, 1))
    with data.open("wb") as f:
        for r in range(0, rows, chunk):
            f.write(block[: min(chunk, rows - r)].tobytes())
    table = TensorProto(name="table", data_type=TensorProto.FLOAT, dims=[rows, width],
                        data_location=TensorProto.EXTERNAL)
    for key, value in (("location", data.name), ("offset", "0"), ("length", str(rows * width * 4))):
        entry = table.external_data.add()
        entry.key, entry.value = key, value
    w = numpy_helper.from_array(np.eye(width, 8, dtype=np.float32), "w")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("MatMul", ["e", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], [table, w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save_model(m, str(path))
    return path


@pytest.mark.slow
def test_a_model_over_2_gb_loads_splits_and_saves_again(tmp_path: Path) -> None:
    from partitioner.model_file import PROTOBUF_LIMIT_BYTES, serialized_bytes
    from partitioner.options import unit_families

    lg = LayerGraph.load(_over_the_limit(tmp_path / "big.onnx"))
    assert serialized_bytes(lg.model) == PROTOBUF_LIMIT_BYTES  # protobuf cannot serialise it whole
    (lookup,) = [u.index for u in lg.units if "Gather" in u.ops]
    assert "embedding" in unit_families(lg, lookup)
    path = save_model(lg.model, tmp_path / "copy" / "big.onnx")
    assert path.with_name("big.onnx.data").stat().st_size > PROTOBUF_LIMIT_BYTES
    assert _in_memory(lg.model)  # the loaded graph keeps its weights
    del lg
    table = onnx.load(str(path), load_external_data=False).graph.initializer[0]
    assert table.data_location == onnx.TensorProto.EXTERNAL


_PEAK_SCRIPT = """
import sys
import numpy as np
import onnxruntime as ort

def peak_mb():  # the process's high-water mark (VmHWM starts again at exec, unlike ru_maxrss)
    with open("/proc/self/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) / 1024

so = ort.SessionOptions()
so.intra_op_num_threads = 1
rows = int(sys.argv[2])
base = peak_mb()
sess = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
for lo in range(0, rows, 4096):  # every row looked up, 4,096 at a time (a service that has run a while)
    sess.run(None, {"idx": np.arange(lo, min(rows, lo + 4096), dtype=np.int64)})
print(peak_mb() - base)
"""

def test_onnxruntime_maps_an_external_data_file_so_the_memory_model_counts_its_weights_once(tmp_path: Path) -> None:
    """The memory model's two factors (``ComputeModel.weights_mb``) are what onnxruntime does: weights written
    into the model file are parsed and copied (peak about twice their bytes); weights in an external data
    file are mapped, so even with every row looked up the process holds them about once."""
    import subprocess
    import sys

    from partitioner.perf.compute import ComputeModel

    rows, dim = 65_536, 256  # a 64 MB table
    table = np.random.default_rng(0).standard_normal((rows, dim), dtype=np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gather", ["table", "idx"], ["out"], axis=0)], "lookup",
        [onnx.helper.make_tensor_value_info("idx", onnx.TensorProto.INT64, ["n"])],
        [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["n", dim])],
        initializer=[numpy_helper.from_array(table, "table")])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    inline = save_model(model, tmp_path / "inline.onnx")
    mapped = save_model(model, tmp_path / "mapped.onnx", threshold_bytes=1_000_000)
    assert not inline.with_name("inline.onnx.data").exists() and mapped.with_name("mapped.onnx.data").exists()

    def peak(path: Path) -> float:
        out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(path), str(rows)], capture_output=True,
                             text=True, check=True)
        return float(out.stdout.strip())

    mb = table.nbytes / 2**20
    assert peak(inline) >= 1.5 * mb
    assert peak(mapped) <= 1.35 * mb

    cm = ComputeModel(unit_ms=({1: 1.0},), unit_flops=(1,))
    assert cm.weights_mb(table.nbytes) == pytest.approx(cm.weight_factor * mb)
    big = model_file.EXTERNAL_DATA_THRESHOLD_BYTES + 2**20  # the exporter writes such a part's weights aside
    assert cm.weights_mb(big) == pytest.approx(big / 2**20)


def test_a_models_raw_tensors_are_counted_without_serialising_them() -> None:
    """A weight's bytes are its elements times their width, read off its shape; only tensors held as raw data
    count towards the bound that spares a big model protobuf's measuring (which serialises it)."""
    from onnx import TensorProto, helper

    from partitioner.model_file import raw_bytes, serialized_bytes, tensor_nbytes

    model = mlp(d_in=12, hidden=64, d_out=6)
    weights = _weights(model)
    assert all(t.HasField("raw_data") for t in model.graph.initializer)
    assert raw_bytes(model) == sum(w.nbytes for w in weights.values())
    assert raw_bytes(model) < serialized_bytes(model) == model.ByteSize()
    typed = helper.make_tensor("k", TensorProto.INT64, [3, 2], [1, 2, 3, 4, 5, 6])  # int64_data, not raw
    assert tensor_nbytes(typed) == 6 * 8
    model.graph.initializer.append(typed)
    assert raw_bytes(model) == sum(w.nbytes for w in weights.values())
    text = helper.make_tensor("s", TensorProto.STRING, [2], [b"ab", b"cde"])
    assert tensor_nbytes(text) == text.ByteSize()


def test_a_model_whose_raw_tensors_pass_the_threshold_goes_to_external_data(tmp_path: Path) -> None:
    model = mlp(d_in=12, hidden=64, d_out=6)
    before = _weights(model)
    limit = model_file.raw_bytes(model) - 1
    path = save_model(model, tmp_path / "m.onnx", threshold_bytes=limit)
    assert path.with_name("m.onnx.data").is_file()
    assert _in_memory(model) and all(np.array_equal(before[k], v) for k, v in _weights(model).items())
    np.testing.assert_allclose(_run(str(path)), _run(model), rtol=1e-6)
