"""A request whose data the model cannot take (a token id past its embedding table) is the client's error:
400 naming the input, over real HTTP, not a 502 from the part onnxruntime refused it in."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from functions.errors import BadInput, PartError
from functions.executor import bad_input
from functions.http_errors import error_response
from partitioner.export import export_bundle
from serving.api import DataPlane, InProcessBackend, create_app
from serving.api.server import AppServer
from tests.integration.test_endpoint import call

VOCAB = 10


def _embedding_model() -> onnx.ModelProto:
    """ids [1, 4] -> Gather(table [VOCAB, 8]) -> MatMul(w [8, 8]) -> Relu -> MatMul(w2 [8, 4])."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((VOCAB, 8)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("MatMul", ["e", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("intake-errors")
    path = d / "emb.onnx"
    onnx.save(_embedding_model(), str(path))
    bundle = export_bundle(path, "0-0:none,1-1:channel=2,2-:none", d / "bundle")
    plane = DataPlane()
    plane.add(InProcessBackend(bundle, name="emb"))
    with AppServer(create_app(plane, token="", max_body_mb=1)) as s:
        yield s.url


def _infer(url: str, ids: list[int]) -> tuple[int, dict]:
    body = json.dumps({"inputs": [{"name": "ids", "shape": [1, 4], "datatype": "INT64", "data": ids}]}).encode()
    status, _, out = call(url + "/v2/models/emb/infer", body, {"Content-Type": "application/json"})
    return status, json.loads(out)


def test_an_index_in_range_answers(server: str) -> None:
    status, doc = _infer(server, [0, 1, 2, VOCAB - 1])
    assert status == 200, doc


def test_an_out_of_range_index_is_400_naming_the_input(server: str) -> None:
    status, doc = _infer(server, [0, 1, 2, VOCAB + 5])
    assert status == 400, doc
    assert "'ids'" in doc["error"] and "out of range" in doc["error"]
    assert f"takes 0..{VOCAB - 1}" in doc["error"]


def test_other_part_failures_stay_502() -> None:
    # a failure that is not an index out of range (a part that crashed) is still the functions' error
    err = PartError("part s00_p00.onnx failed: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : bad alloc")
    assert bad_input(err, {"ids": np.array([[1, 2]])}) is None
    assert error_response(err).status == 502
    assert error_response(BadInput("input 'ids' holds an index out of range")).status == 400
