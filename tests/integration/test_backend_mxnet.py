"""The MXNet part-execution backend: parts rewritten for MXNet 1.9's importer, refused when they use what it
lacks, and bundles split spatially and by channels giving onnxruntime's outputs when their functions run
with MXNet on the local platform (in the cached MXNet environment, made once by the fixture)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import helper

from functions.backends import backend_memory_mb, make_session_cache
from functions.backends.mxnet_onnx import MXNET_OPSET, MXNetIncompatible, mxnet_problems, to_mxnet_onnx
from partitioner.errors import UnsupportedByBackend
from partitioner.export import export_bundle
from tests.conftest import PROJECT_ROOT
from tests.onnx_builders import conv_stack, make_model, mlp

TOL = 1e-4


def _cnn() -> onnx.ModelProto:
    """Conv -> pool -> conv -> conv: units a spatial 2x2 split and a channel split both admit."""
    return conv_stack([
        {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8},
        {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
        {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8},
        {"op": "Conv", "k": (1, 1), "cout": 6},
    ], cin=3, h=16, w=16)


def _run(model: onnx.ModelProto, x: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, x)


# -- the rewrite and the op check (no MXNet needed) --------------------------------------------------------

def test_rewrite_brings_opset_down_relists_initializers_and_keeps_the_outputs() -> None:
    model = _cnn()
    before = model.SerializeToString()
    out = to_mxnet_onnx(model)
    assert model.SerializeToString() == before, "the caller's model was modified"
    assert max(o.version for o in out.opset_import if o.domain == "") == MXNET_OPSET
    inputs = {i.name for i in out.graph.input}
    assert {t.name for t in out.graph.initializer} <= inputs
    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    np.testing.assert_allclose(_run(out, x)[0], _run(model, x)[0], rtol=1e-5, atol=1e-5)


def test_rewrite_moves_opset18_reduce_axes_back_to_an_attribute() -> None:
    axes = np.array([2, 3], dtype=np.int64)
    nodes = [helper.make_node("ReduceMean", ["input", "axes"], ["output"], keepdims=1)]
    model = make_model(nodes, [("input", (1, 2, 3, 4))], ["output"], {"axes": axes}, opset=18)
    out = to_mxnet_onnx(model)
    node = out.graph.node[0]
    assert list(node.input) == ["input"]
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["axes"] == [2, 3]
    assert "axes" not in {t.name for t in out.graph.initializer}
    x = {"input": np.random.default_rng(1).standard_normal((1, 2, 3, 4)).astype(np.float32)}
    np.testing.assert_allclose(_run(out, x)[0], _run(model, x)[0], rtol=1e-6)


def test_ops_and_options_mxnet_lacks_are_named() -> None:
    nodes = [helper.make_node("Erf", ["input"], ["e"]), helper.make_node("Relu", ["e"], ["output"])]
    model = make_model(nodes, [("input", (1, 4))], ["output"], {})
    problems = mxnet_problems(model, where="parts/x.onnx")
    assert problems and "Erf" in problems[0] and problems[0].startswith("parts/x.onnx")
    with pytest.raises(MXNetIncompatible, match="Erf"):
        to_mxnet_onnx(model)
    ceil = conv_stack([{"op": "MaxPool", "k": (2, 2), "s": (2, 2), "ceil": 1}], cin=1, h=5, w=5)
    assert any("ceil_mode" in p for p in mxnet_problems(ceil))


def test_export_refuses_a_part_with_an_op_mxnet_lacks(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gemm", ["input", "w", "b"], ["h"], transB=1),
        helper.make_node("Erf", ["h"], ["output"]),  # GELU's core: MXNet 1.9's importer has no Erf
    ]
    model = make_model(nodes, [("input", (1, 8))], ["output"],
                       {"w": rng.standard_normal((6, 8)).astype(np.float32),
                        "b": rng.standard_normal(6).astype(np.float32)})
    with pytest.raises(UnsupportedByBackend, match=r"(?s)cannot run 1 part.*Erf.*drop --backend mxnet"):
        export_bundle(model, "0-:none", tmp_path / "b", backend="mxnet")
    assert not (tmp_path / "b").exists(), "a refused bundle was written"
    # the same model exports for onnxruntime, and `flatpack run --backend mxnet` refuses it before starting
    bundle = export_bundle(model, "0-:none", tmp_path / "ort")
    from serving.cli import main

    res = CliRunner().invoke(main, ["run", str(bundle), "--backend", "mxnet", "--requests", "1"])
    assert res.exit_code != 0 and "cannot run this bundle" in res.output and "Erf" in res.output


def test_export_for_mxnet_writes_rewritten_verified_parts(tmp_path: Path) -> None:
    bundle = export_bundle(_cnn(), "0-1:spatial=2x2,2-:channel=2", tmp_path / "b", backend="mxnet")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["backend"] == "mxnet" and manifest["verification"]["max_rel_err"] <= TOL
    for part in sorted((bundle / "parts").glob("*.onnx")):
        m = onnx.load(str(part))
        assert max(o.version for o in m.opset_import if o.domain == "") <= MXNET_OPSET
        assert {t.name for t in m.graph.initializer} <= {i.name for i in m.graph.input}


def test_a_gemm_without_c_gets_a_zero_c_and_keeps_its_outputs() -> None:
    """MXNet 1.9's importer reads Gemm's C unconditionally ("list index out of range" without one)."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Gemm", ["input", "w"], ["output"], transB=1)]
    model = make_model(nodes, [("input", (1, 8))], ["output"], {"w": rng.standard_normal((6, 8)).astype(np.float32)})
    assert mxnet_problems(model) == []
    out = to_mxnet_onnx(model)
    gemm = out.graph.node[0]
    assert len(gemm.input) == 3
    c = next(t for t in out.graph.initializer if t.name == gemm.input[2])
    assert list(c.dims) == [6] and c.name in {i.name for i in out.graph.input}
    x = {"input": rng.standard_normal((1, 8)).astype(np.float32)}
    np.testing.assert_allclose(_run(out, x)[0], _run(model, x)[0], rtol=1e-6)


def test_a_reduction_split_exports_for_mxnet_with_every_gemm_complete(tmp_path: Path) -> None:
    """A reduction split's parts are Gemms without C (the bias is added once at the join): written for MXNet,
    each has its zero C, and the bundle still reproduces the model."""
    bundle = export_bundle(mlp(d_in=16, hidden=12, d_out=6), "0:reduction=2,1-:none", tmp_path / "b", backend="mxnet")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["verification"]["max_rel_err"] <= TOL
    gemms = [n for part in (bundle / "parts").glob("*.onnx") for n in onnx.load(str(part)).graph.node
             if n.op_type == "Gemm"]
    assert len(gemms) >= 2 and all(len(n.input) == 3 and n.input[2] for n in gemms)


def test_default_backend_is_unchanged_and_memory_grows_only_for_mxnet() -> None:
    from functions.config import FunctionConfig
    from functions.session import SessionCache
    from serving.platform.spec import FunctionSpec

    assert FunctionSpec.from_json({"name": "f", "memory_mb": 256}).backend == "onnxruntime"
    assert FunctionConfig.from_env({"FLATPACK_BUNDLE_DIR": "b", "FLATPACK_DEPLOYMENT": "d",
                                    "FLATPACK_FUNCTION": "f"}).backend == "onnxruntime"
    with pytest.raises(ValueError, match="FLATPACK_BACKEND"):
        FunctionConfig.from_env({"FLATPACK_BUNDLE_DIR": "b", "FLATPACK_DEPLOYMENT": "d", "FLATPACK_FUNCTION": "f",
                                 "FLATPACK_BACKEND": "tvm"})
    assert isinstance(make_session_cache("onnxruntime"), SessionCache)
    assert backend_memory_mb("onnxruntime", 192, 10 << 20) == 192
    assert backend_memory_mb("mxnet", 192, 10 << 20) == 384  # 192 + 128 + 10, up to a 64 MB step


def test_platform_refuses_an_mxnet_function_without_its_environment(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fastapi", reason="the local platform needs flatpack[server]")
    from serving.platform.config import PlatformConfig
    from serving.platform.service import PlatformService
    from serving.platform.spec import FunctionSpec

    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path))
    service = PlatformService(PlatformConfig(port=0, cpu_limit="off"))
    with pytest.raises(ValueError, match="flatpack backend setup mxnet"):
        service._python(FunctionSpec("f", 256, backend="mxnet"))
    assert service._python(FunctionSpec("g", 256)) == service.config.python


# -- the same bundles under both backends (the MXNet environment, created once into the cache) ------------

@pytest.fixture(scope="session")
def mxnet_python() -> str:
    from serving.platform.runtimes import BackendEnvError, ensure_backend_env

    try:
        env = ensure_backend_env("mxnet")
    except BackendEnvError as e:
        pytest.skip(f"the MXNet environment cannot be created here (it needs the package index once): {e}")
    return str(env.python)


BUNDLES = {
    "spatial": (_cnn, "0-1:spatial=2x2,2:none"),
    "channel": (_cnn, "0:none,1:channel=4,2:channel=3"),
    "mlp-channel": (mlp, "0:channel=2,1-:none"),
}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mx")
    return {name: export_bundle(build(), spec, root / name) for name, (build, spec) in BUNDLES.items()}


@pytest.mark.parametrize("name", sorted(BUNDLES))
def test_parts_give_onnxruntimes_outputs_under_mxnet(mxnet_python: str, bundles: dict[str, Path], name: str) -> None:
    """Every part of the (onnxruntime-exported) bundle, run by the MXNet runtime in its environment."""
    from bench.components.backends import measure

    result = measure(bundles[name], reps=3, warmup=1)
    assert len(result.parts) >= 2
    assert result.max_rel_err <= TOL, result.parts


@pytest.mark.parametrize("name", sorted(BUNDLES))
def test_bundle_on_the_platform_with_mxnet_equals_the_model(mxnet_python: str, bundles: dict[str, Path],
                                                            name: str, shm_root: Path) -> None:
    pytest.importorskip("fastapi", reason="the local platform needs flatpack[server]")
    from serving.platform import PlatformConfig
    from serving.runner import run_bundle

    report = run_bundle(bundles[name], transport="shm", requests=2, overhead=False, backend="mxnet",
                        platform=PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="off"))
    assert report.errors == 0, report.first_error
    assert report.correct == 2 and report.max_rel_err <= TOL
    assert report.leftover_tensors == 0 and report.backend == "mxnet"
    # the functions ran under the MXNet environment's interpreter, not flatpack's
    assert report.functions and all(f["memory_mb"] > 128 for f in report.functions.values())


def test_function_runtime_loads_parts_with_mxnet_in_its_environment(mxnet_python: str, bundles: dict[str, Path]
                                                                    ) -> None:
    code = (
        "import sys; from functions.config import FunctionConfig; from functions.runtime import FunctionRuntime\n"
        "rt = FunctionRuntime(FunctionConfig.from_env()); import mxnet, numpy\n"
        "print(type(rt.sessions).__name__, len(rt.sessions), numpy.__version__, 'onnxruntime' in sys.modules)"
    )
    env = {"PYTHONPATH": str(PROJECT_ROOT), "FLATPACK_BUNDLE_DIR": str(bundles["spatial"]), "FLATPACK_DEPLOYMENT": "t",
           "FLATPACK_FUNCTION": "master", "FLATPACK_BACKEND": "mxnet", "PATH": "/usr/bin:/bin"}
    res = subprocess.run([mxnet_python, "-c", code], capture_output=True, text=True, env=env, check=False, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    kind, n, numpy_version, has_ort = res.stdout.split()
    assert kind == "MXNetSessionCache" and int(n) >= 1
    assert numpy_version.startswith("1.23") and has_ort == "False"
    assert sys.executable != mxnet_python


# -- cloud packaging with the MXNet runtime (rendering only) ----------------------------------------------

def test_lambda_service_for_mxnet_is_one_container_image(tmp_path: Path) -> None:
    import yaml

    from serving.deploy.lambda_service import LambdaOptions, LambdaService, render_lambda_service
    from tests.conftest import conv_channel_bundle

    bundle = conv_channel_bundle(tmp_path / "conv")
    svc = render_lambda_service(bundle, tmp_path / "svc", deployment="mx",
                                options=LambdaOptions(backend="mxnet", vendor=True))
    root = tmp_path / "svc"
    reqs = (root / "requirements.txt").read_text()
    assert "mxnet==1.9.1" in reqs and "numpy==1.23.5" in reqs and "onnxruntime" not in reqs
    docker = (root / "Dockerfile").read_text()
    assert "public.ecr.aws/lambda/python:3.11" in docker and 'CMD ["flatpack_entry.handler"]' in docker
    assert not (root / "vendor").exists(), "an image service vendors nothing"
    doc = yaml.safe_load((root / "flatpack.yml").read_text())
    assert doc["provider"]["environment"]["FLATPACK_BACKEND"] == "mxnet"
    assert doc["provider"]["ecr"]["images"]["flatpack"]["path"] == "./${self:custom.flatpack.prefix}"
    for spec in doc["functions"].values():
        assert spec["image"] == {"name": "flatpack", "command": ["flatpack_entry.handler"]}
        assert "handler" not in spec and "package" not in spec
    assert svc.image and not any(svc.parts_in_s3.values())
    assert LambdaService.load(root).options.backend == "mxnet"
    # the default stays a zip package without the variable
    render_lambda_service(bundle, tmp_path / "zip", deployment="mx", options=LambdaOptions(vendor=False))
    plain = yaml.safe_load((tmp_path / "zip" / "flatpack.yml").read_text())
    assert "FLATPACK_BACKEND" not in plain["provider"]["environment"] and "ecr" not in plain["provider"]
    assert not (tmp_path / "zip" / "Dockerfile").exists()


def test_openfaas_stack_for_mxnet_installs_it_on_python_311(tmp_path: Path) -> None:
    import yaml

    from serving.deploy.openfaas import OpenFaaSOptions, render_openfaas_stack
    from tests.conftest import conv_channel_bundle

    bundle = conv_channel_bundle(tmp_path / "conv")
    render_openfaas_stack(bundle, tmp_path / "st", deployment="mx", options=OpenFaaSOptions(backend="mxnet"))
    reqs = (tmp_path / "st" / "template" / "flatpack" / "requirements.txt").read_text()
    assert "mxnet==1.9.1" in reqs and "numpy==1.23.5" in reqs and "onnxruntime" not in reqs
    stack = yaml.safe_load((tmp_path / "st" / "stack.yml").read_text())
    for spec in stack["functions"].values():
        assert spec["environment"]["FLATPACK_BACKEND"] == "mxnet"
        assert spec["build_args"] == {"PYTHON_VERSION": "3.11"}
