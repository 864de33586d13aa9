"""`flatpack calibrate` on OpenFaaS and AWS Lambda, offline: the probe functions deployed by flatpack's own
deployers (the gateway's API on the test gateway; boto3 on moto, invoked under serverless-offline), timed
from here, removed afterwards; the profile written is what `flatpack plan --platform FILE` plans with."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from platforms import load_profile
from serving.calibrate import CalibrationResult, CalibrationSettings, Cloud, calibrate
from serving.calibrate.cloud import parse_report
from serving.cli import main
from tests.integration.openfaas_gateway import Gateway

KIB = 2**10


def _settings(**kw: object) -> CalibrationSettings:
    """As few samples as a fit takes; two sizes far apart, so that the bytes' time shows under load."""
    base: dict = {"invoke_samples": 8, "transfer_samples": 3, "cold_starts": 1, "cpu_samples": 3,
                  "sizes": (4 * KIB, 2048 * KIB), "transports": ("inline",), "compute_n": 64, "compute_layers": 4,
                  "evict_bytes": 0, "cpu_share_mb": (512,)}
    base.update(kw)
    return CalibrationSettings(**base)  # type: ignore[arg-type]


def _free_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _assert_measured(result: CalibrationResult, base: str, where: str) -> None:
    prof, default = load_profile(result.path), load_profile(base)
    assert prof.name == base
    inv = prof.invoke_latency
    assert inv.mean > 0 and inv.sigma >= 0 and inv.tau >= 0
    assert inv != default.invoke_latency
    for field in ("invoke_latency_ms", "cold_start_ms"):
        assert prof.sources[field].startswith("measured by flatpack calibrate on "), field
    assert "8 warm round trips of a no-op function" in prof.sources["invoke_latency_ms"]
    assert where in prof.sources["calibration"]
    # the inline transport's transfers, fitted or (a loaded machine) named with the reason
    cal = result.calibration
    assert "inline" in prof.transports or "inline" in cal.skipped
    if "inline" in cal.transfers:  # what `deploy --target lambda|openfaas` sends tensors by
        assert prof.sources["transports"].startswith("measured by flatpack calibrate on ")
        assert prof.bandwidth_mb_s == prof.transports["inline"].bandwidth_mb_s
        assert "the inline transport's fitted bandwidth" in prof.sources["bandwidth_mb_s"]
    assert prof.cold_start_ms is not None and prof.cold_start_ms >= 0


def _plan_with(path: Path, tmp_path: Path) -> dict:
    from tests.onnx_builders import mlp

    onnx.save(mlp(), str(tmp_path / "mlp.onnx"))
    r = CliRunner().invoke(main, ["plan", str(tmp_path / "mlp.onnx"), "--platform", str(path), "--transport", "inline",
                                  "--profile", "flops", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["platform"] == str(path)
    return doc


# --------------------------------------------------------------------------------------------------
# OpenFaaS, through the gateway deployer
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Gateway, Path]]:
    """The test gateway, each probe's function run from the stack calibrate rendered for it in ``work``."""
    work = tmp_path / "work"
    monkeypatch.setenv("FLATPACK_OPENFAAS_USER", "admin")
    monkeypatch.setenv("FLATPACK_OPENFAAS_PASSWORD", "s3cret")
    with Gateway(lambda doc: work / doc["envVars"]["FLATPACK_DEPLOYMENT"], "admin", "s3cret") as gw:
        yield gw, work


def test_openfaas_calibration_writes_a_profile_plan_takes(gateway: tuple[Gateway, Path], tmp_path: Path) -> None:
    gw, work = gateway
    result = calibrate("openfaas", output=tmp_path / "openfaas.yaml", settings=_settings(),
                       cloud=Cloud(gateway=gw.url), workdir=work)
    _assert_measured(result, "openfaas", f"OpenFaaS at {gw.url}")
    prof, base = load_profile(result.path), load_profile("openfaas")
    # OpenFaaS bills nothing: the overhead is the base profile's, and the file says it was not measured
    assert result.calibration.billed_overhead_ms is None
    assert prof.billed_overhead_ms == base.billed_overhead_ms
    assert prof.sources["billed_overhead_ms"].startswith("not measured by flatpack calibrate")
    # the CPU share from the compute probe at 512 MB against one vCPU (the gateway gives each a whole core)
    (share,) = result.calibration.cpu_share
    assert (share.memory_mb, share.reference_mb, share.metered) == (512, base.mb_per_vcpu, False)
    assert prof.cpu_share[512] > 0
    # every probe is gone from the gateway, its process stopped; the rendered stacks were kept (--work-dir)
    assert gw.functions == {}
    posted = [name for method, name in gw.requests if method == "POST"]
    deleted = [name for method, name in gw.requests if method == "DELETE"]
    assert posted and sorted(posted) == sorted(deleted)
    assert all(n.startswith("fpcal") and n.endswith("-master") for n in posted)
    assert len(list(work.glob("fpcal*/stack.yml"))) == len(posted)
    _plan_with(result.path, tmp_path)


def _failing_compute(n: int = 64, layers: int = 4) -> onnx.ModelProto:
    """A compute probe that fails when it runs: x[n, n] reshaped to [7, 7]."""
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.asarray([7, 7], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "broken",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 7])], initializer=[shape])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_openfaas_probes_are_removed_when_a_measurement_fails(gateway: tuple[Gateway, Path], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe that fails when it runs (the CPU share's, after the other probes ran) fails the calibration
    with one line naming it, and the probes deployed then are removed all the same."""
    import serving.calibrate.measure as measure
    from serving.calibrate.cloud import CalibrationFailed

    gw, work = gateway
    monkeypatch.setattr(measure, "compute_model", _failing_compute)
    with pytest.raises(CalibrationFailed, match=r"probe fpcal\w+-\d+-master failed: .*Reshape"):
        calibrate("openfaas", output=tmp_path / "x.yaml", cloud=Cloud(gateway=gw.url), workdir=work,
                  settings=_settings(sizes=(4 * KIB, 8 * KIB)))
    assert gw.functions == {}
    assert any(method == "DELETE" for method, _ in gw.requests)
    assert not (tmp_path / "x.yaml").exists()


def test_cli_bad_gateway_and_endpoint_are_one_line_errors(tmp_path: Path) -> None:
    for args in (["--platform", "openfaas", "--gateway", _free_url()],
                 ["--platform", "aws-lambda", "--endpoint-url", _free_url(), "--region", "us-east-1", "--no-vendor"]):
        r = CliRunner().invoke(main, ["calibrate", *args, "-o", str(tmp_path / "x.yaml")])
        assert r.exit_code == 1, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and "does not answer" in lines[0], r.output
        assert "Traceback" not in r.output
    assert not (tmp_path / "x.yaml").exists()
    r = CliRunner().invoke(main, ["calibrate", "--platform", "aws-lambda", "--gateway", "http://127.0.0.1:1"])
    assert r.exit_code == 2 and "--gateway does not apply to --platform aws-lambda" in r.output
    r = CliRunner().invoke(main, ["calibrate", "--platform", "openfaas", "--endpoint-url", "http://127.0.0.1:1"])
    assert r.exit_code == 2 and "--endpoint-url does not apply to --platform openfaas" in r.output


def test_cloud_profiles_are_cached_by_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path))
    from serving.calibrate import calibrated_profile_path

    host = Cloud(endpoint_url="http://127.0.0.1:4566").where("aws-lambda")
    assert calibrated_profile_path("aws-lambda", host=host).name == "aws-lambda-127.0.0.1_4566.yaml"
    assert Cloud(region="eu-west-1").where("aws-lambda") == "eu-west-1"
    assert Cloud(gateway="http://gw.example:8080").where("openfaas") == "gw.example:8080"


def test_lambda_report_line_is_read() -> None:
    import base64

    tail = ("START RequestId: 1 Version: 3\nEND RequestId: 1\nREPORT RequestId: 1\tDuration: 1.52 ms\t"
            "Billed Duration: 2 ms\tMemory Size: 1769 MB\tMax Memory Used: 71 MB\tInit Duration: 412.30 ms\t\n")
    rep = parse_report(base64.b64encode(tail.encode()).decode())
    assert rep is not None and (rep.duration_ms, rep.billed_ms, rep.init_ms) == (1.52, 2.0, 412.3)
    assert parse_report(None) is None and parse_report(base64.b64encode(b"no report").decode()) is None


def test_usage_is_the_platforms_report_else_the_handlers_timing() -> None:
    """Lambda's REPORT durations are metered (the billed overhead is measured from them); an invocation
    without one (an emulator) counts the handler's own time and makes the whole record unmetered."""
    from functions.event import Reply
    from serving.calibrate.cloud import Report, _usage_after
    from serving.calibrate.measure import Usage

    reply = Reply(timings={"total_ms": 0.4})
    u = _usage_after(Usage(), reply, Report(1.5, 2.0, 300.0))
    u = _usage_after(u, reply, Report(0.5, 1.0))
    assert (u.invocations, u.duration_ms, u.cold_starts, u.init_ms, u.metered) == (2, 2.0, 1, 300.0, True)
    u = _usage_after(u, reply, None)
    assert (u.invocations, u.duration_ms, u.metered) == (3, 2.4, False)


# --------------------------------------------------------------------------------------------------
# AWS Lambda, through the boto3 deployer: moto's control plane, serverless-offline running the functions
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def emulator(aws_env: None, tmp_path: Path) -> Iterator[object]:
    pytest.importorskip("moto.server", reason="the Lambda emulator needs moto[server] (pip install 'flatpack[dev]')")
    from tests.integration.lambda_emulator import LambdaEmulator
    from tests.integration.serverless import serverless_cli

    with LambdaEmulator(serverless_cli(), tmp_path / "offline") as emu:
        yield emu


def test_lambda_calibration_through_the_deployer(emulator: object, tmp_path: Path) -> None:
    import boto3

    url = emulator.url  # type: ignore[attr-defined]
    lam = boto3.client("lambda", endpoint_url=url, region_name="us-east-1")
    before = {f["FunctionName"] for f in lam.list_functions()["Functions"]}
    result = calibrate("aws-lambda", output=tmp_path / "lambda.yaml", cloud=Cloud(endpoint_url=url, vendor=False),
                       settings=_settings(cpu_share_mb=()))
    _assert_measured(result, "aws-lambda", f"AWS Lambda at {url}")
    prof, base = load_profile(result.path), load_profile("aws-lambda")
    # serverless-offline returns no log tail: no billed duration to read, so the base profile's is kept
    assert result.calibration.billed_overhead_ms is None
    assert prof.billed_overhead_ms == base.billed_overhead_ms
    assert "reported no billed duration" in prof.sources["billed_overhead_ms"]
    # the probes were functions created by the deployer, run by serverless-offline, and are all gone
    started = emulator.started  # type: ignore[attr-defined]
    assert started and all(n.startswith("fpcal") and n.endswith("-master") for n in started)
    assert {f["FunctionName"] for f in lam.list_functions()["Functions"]} == before
    assert emulator.functions_running == []  # type: ignore[attr-defined]
    iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1")
    assert not [r["RoleName"] for r in iam.list_roles()["Roles"] if r["RoleName"].startswith("flatpack-fpcal")]
    _plan_with(result.path, tmp_path)
