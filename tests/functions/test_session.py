"""A part's sessions: its weights mapped in at the cold start, not a page fault at a time by its requests."""

from __future__ import annotations

import mmap
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from functions.session import MAP_HEADROOM_MB, SessionCache, map_weights

ROWS, DIM = 16384, 64  # a 4 MB table: 1024 pages, each read by a lookup only where a request points


def _lookup_model(path: Path) -> np.ndarray:
    table = np.random.default_rng(0).standard_normal((ROWS, DIM)).astype(np.float32)
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [4])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, DIM])
    g = helper.make_graph([helper.make_node("Gather", ["table", "idx"], ["out"])], "lookup", [idx], [out],
                          initializer=[numpy_helper.from_array(table, "table")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path, save_as_external_data=True, location=path.name + ".data")
    return table


def _resident(data: Path) -> int:
    """Bytes of ``data`` this process has mapped in (its mappings' Rss)."""
    total, hit = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
            hit = line.rstrip().endswith(str(data))
        elif hit and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_warm_up_maps_a_lookup_tables_pages_in_and_answers_as_before(tmp_path: Path) -> None:
    path = tmp_path / "lookup.onnx"
    table = _lookup_model(path)
    data = tmp_path / "lookup.onnx.data"
    cache = SessionCache(intra_op_threads=1)
    cache.get(path)
    if _resident(data) == 0 and not any(str(data) in x for x in Path("/proc/self/maps").read_text().splitlines()):
        pytest.skip("onnxruntime read the table rather than mapping it")
    assert cache.warm_up(path)
    # every page of the table mapped in by the warm-up, not left to the requests
    assert _resident(data) >= table.nbytes
    idx = np.array([0, 5, ROWS - 1, 123], np.int64)
    np.testing.assert_array_equal(cache.run(path, {"idx": idx})["out"], table[idx])


def test_mapping_weights_in_touches_only_the_models_directory(tmp_path: Path) -> None:
    # nothing of this empty directory is mapped into the process: nothing to fault in
    (tmp_path / "elsewhere").mkdir()
    assert map_weights(tmp_path / "elsewhere" / "model.onnx") == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_function_maps_in_only_what_its_memory_size_leaves_room_for(tmp_path: Path) -> None:
    path = tmp_path / "lookup.onnx"
    table = _lookup_model(path)
    cache = SessionCache(intra_op_threads=1)
    cache.get(path)  # the session holds the table's mapping while the cache lives
    page = mmap.PAGESIZE
    with open("/proc/self/statm") as f:
        resident_mb = int(f.read().split()[1]) * page / 2**20
    # room for 1 MB of the 4 MB table under the limit: that much is mapped in, the rest left to the requests
    mapped = map_weights(path, limit_mb=resident_mb + MAP_HEADROOM_MB + 1)
    assert 0 < mapped <= 2**20 < table.nbytes
    # no room at all: nothing
    assert map_weights(path, limit_mb=resident_mb) == 0
    assert cache.input_names(path) == ["idx"]
