"""The endpoint as Triton's own client sees it: tritonclient[http] over real HTTP against an in-process
endpoint serving a small zoo classifier (resnet18, width / 8, 32 x 32, 1000 classes).

Metadata and readiness with and without a model version, JSON and binary inference (sync, async and the
asyncio client) equal to onnxruntime's, gzip and deflate request bodies, the classification extension,
and the read-only extensions a client calls first: repository index, model config, statistics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from functions.session import make_session
from partitioner.export import export_bundle
from serving.api import DataPlane, InProcessBackend, create_app
from serving.api.server import AppServer

MODEL = "resnet"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from zoo import build_to_file

    d = tmp_path_factory.mktemp("triton")
    path = build_to_file("resnet18", d / "m.onnx", width_div=8, input_size=32)
    bundle = export_bundle(path, "0-:none", d / "bundle")
    plane = DataPlane()
    plane.add(InProcessBackend(bundle, name=MODEL))
    with AppServer(create_app(plane, token="", max_body_mb=1)) as s:
        yield s.url.removeprefix("http://"), path


@pytest.fixture(scope="module")
def client(served: tuple[str, Path]) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(served[0], concurrency=4) as c:
        yield c


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def want(served: tuple[str, Path], x: np.ndarray) -> np.ndarray:
    return make_session(served[1]).run(None, {"input": x})[0]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


def _inputs(x: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    return [inp]


def test_metadata_and_readiness_with_and_without_a_version(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata()
    assert {"binary_tensor_data", "classification", "model_configuration", "statistics"} <= set(server["extensions"])
    for version in ("", "1"):
        assert client.is_model_ready(MODEL, version)
        meta = client.get_model_metadata(MODEL, version)
        assert meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32]}]
        assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [1, 1000]}]
    assert not client.is_model_ready(MODEL, "2")
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata(MODEL, "2")
    assert e.value.status() == "404" and "has no version '2'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("nope")
    assert e.value.status() == "404" and "not served here" in e.value.message()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("version", ["", "1"], ids=["no-version", "version-1"])
def test_inference_equals_onnxruntime(client: httpclient.InferenceServerClient, x: np.ndarray, want: np.ndarray,
                                      binary: bool, version: str) -> None:
    result = client.infer(MODEL, _inputs(x, binary), model_version=version, request_id="r7",
                          outputs=[httpclient.InferRequestedOutput("output", binary_data=binary)])
    _close(result.as_numpy("output"), want)
    response = result.get_response()
    assert response["id"] == "r7" and response["model_name"] == MODEL and response["model_version"] == "1"
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, _inputs(x, binary), model_version="3")
    assert e.value.status() == "404"


def test_async_inference(client: httpclient.InferenceServerClient, served: tuple[str, Path], x: np.ndarray,
                         want: np.ndarray) -> None:
    pending = [client.async_infer(MODEL, _inputs(x, i % 2 == 0), model_version="1" if i % 3 else "")
               for i in range(6)]
    for p in pending:
        _close(p.get_result(timeout=60).as_numpy("output"), want)

    async def with_asyncio() -> np.ndarray:
        async with aioclient.InferenceServerClient(served[0]) as c:
            assert await c.is_model_ready(MODEL, "1")
            inp = aioclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            result = await c.infer(MODEL, [inp], model_version="1")
            return result.as_numpy("output")

    _close(asyncio.run(with_asyncio()), want)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_compressed_request_bodies(client: httpclient.InferenceServerClient, x: np.ndarray, want: np.ndarray,
                                   algorithm: str, binary: bool) -> None:
    result = client.infer(MODEL, _inputs(x, binary), request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm)
    _close(result.as_numpy("output"), want)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_classification_is_the_top_k_as_triton_writes_it(client: httpclient.InferenceServerClient, x: np.ndarray,
                                                          want: np.ndarray, binary: bool) -> None:
    result = client.infer(MODEL, _inputs(x, binary),
                          outputs=[httpclient.InferRequestedOutput("output", binary_data=binary, class_count=3)])
    got = result.as_numpy("output")
    assert got.shape == (3,)
    flat = want.reshape(-1)
    top = np.argsort(-flat, kind="stable")[:3]
    for entry, index in zip(got, top, strict=True):
        text = entry.decode() if isinstance(entry, bytes) else str(entry)
        value, idx = text.split(":")
        assert int(idx) == index and value == f"{float(flat[index]):f}"


def test_classification_of_a_bad_count_is_a_clear_400(client: httpclient.InferenceServerClient,
                                                       x: np.ndarray) -> None:
    out = httpclient.InferRequestedOutput("output", class_count=-2)
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, _inputs(x, True), outputs=[out])
    assert e.value.status() == "400" and "'classification' must be a non-negative integer" in e.value.message()


def test_repository_index_config_and_statistics(client: httpclient.InferenceServerClient, x: np.ndarray) -> None:
    assert client.get_model_repository_index() == [{"name": MODEL, "version": "1", "state": "READY", "reason": ""}]
    for version in ("", "1"):
        config = client.get_model_config(MODEL, version)
        assert config["name"] == MODEL and config["max_batch_size"] == 0 and config["backend"] == "onnxruntime"
        assert config["input"][0]["data_type"] == "TYPE_FP32" and config["input"][0]["dims"] == [1, 3, 32, 32]
        assert config["output"][0]["dims"] == [1, 1000]
    before = client.get_inference_statistics(MODEL)["model_stats"][0]
    client.infer(MODEL, _inputs(x, True))
    with pytest.raises(InferenceServerException):
        client.infer(MODEL, _inputs(np.zeros((1, 3, 32, 31), np.float32), True))
    after = client.get_inference_statistics(MODEL, "1")["model_stats"][0]
    assert after["name"] == MODEL and after["version"] == "1"
    assert after["inference_count"] == before["inference_count"] + 1
    for key in ("success", "fail"):
        assert after["inference_stats"][key]["count"] == before["inference_stats"][key]["count"] + 1
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    assert after["last_inference"] > 0
    every = client.get_inference_statistics()["model_stats"]
    assert [s["name"] for s in every] == [MODEL]
