"""`flatpack calibrate` against a real local platform (in this process): the profile it writes loads,
says what was measured, and is what `flatpack plan --platform FILE` plans with."""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from platforms import MB, PlatformProfile, load_profile, load_profile_data

pytest.importorskip("fastapi", reason="calibrate runs the local platform: flatpack[server]")

from serving.calibrate import (  # noqa: E402
    CalibrationResult,
    CalibrationSettings,
    calibrate,
    calibrated_profile,
    calibrated_profile_path,
)
from serving.cli import main  # noqa: E402

KIB = 2**10


@pytest.fixture(scope="module")
def calibrated(platform: object, shm_root: Path, tmp_path_factory: pytest.TempPathFactory) -> CalibrationResult:
    """One calibration with few samples, three sizes up to 4 MiB (so that a loaded machine's noise cannot
    hide the bytes' time), inline and shm, a small compute probe."""
    settings = CalibrationSettings(invoke_samples=60, transfer_samples=7, cold_starts=1, cpu_samples=3,
                                   dispatch_samples=10,
                                   sizes=(4 * KIB, 1 * MB, 4 * MB), transports=("inline", "shm"), compute_n=64,
                                   compute_layers=4, evict_bytes=4 * MB, shm_dir=shm_root, cpu_share_mb=(512,))
    out = tmp_path_factory.mktemp("calibrate") / "local-test.yaml"
    return calibrate("local", output=out, url=platform.url, settings=settings)  # type: ignore[attr-defined]


def test_the_profile_loads_and_says_what_was_measured(calibrated: CalibrationResult) -> None:
    prof = load_profile(calibrated.path)
    base = load_profile("local")
    assert prof.name == "local"
    inv = prof.invoke_latency
    assert all(math.isfinite(v) for v in (inv.mu, inv.sigma, inv.tau))
    assert inv.mean > 0 and inv.sigma >= 0 and inv.tau >= 0
    # the fit describes the round trips it was fitted to
    assert 0.2 * calibrated.calibration.invoke_p50_ms < inv.mean < 5 * calibrated.calibration.invoke_p50_ms
    assert prof.billed_overhead_ms > 0
    assert set(prof.transports) == {"inline", "shm"}, calibrated.calibration.skipped
    assert all(t.latency_ms >= 0 and t.bandwidth_mb_s > 0 for t in prof.transports.values())
    # a further tensor of several is measured where tensors move by reference (inline ones ride the call)
    shm = calibrated.calibration.transfers["shm"].tensors
    assert shm is not None and shm.tensors == 8 and shm.billed_ms is not None and shm.rtt_ms >= 0
    assert prof.transports["shm"].tensor_ms == pytest.approx(shm.billed_ms, abs=1e-4)
    assert prof.transports["inline"].tensor_ms is None
    assert "8 small tensors" in prof.sources["transports"]
    assert prof.bandwidth_mb_s == prof.transports["shm"].bandwidth_mb_s  # the local deploy's transport
    assert prof.cold_start_ms is not None and prof.cold_start_ms >= 0
    assert set(prof.cpu_share) == {512} and prof.cpu_share[512] > 0
    # the fork probes, at one vCPU and below: the master's CPU grows with its workers, and the profile keeps
    # the growth per worker at each master memory
    dispatch = calibrated.calibration.dispatch
    assert [d.memory_mb for d in dispatch] == [1769, 512]
    # (over both sizes: a median of a few requests at one size can flip on a loaded CI machine)
    assert sum(d.master_cpu_ms[4] for d in dispatch) > sum(d.master_cpu_ms[2] for d in dispatch)
    for d in dispatch:
        assert set(d.master_cpu_ms) == {2, 4} and min(d.master_cpu_ms.values()) > 0
        assert prof.dispatch_ms[d.memory_mb] == pytest.approx(d.dispatch_ms, abs=1e-4)
        assert 0 <= prof.dispatch_ms[d.memory_mb] < d.master_cpu_ms[4]
        # the line through both worker counts at none: the stage's own CPU beyond its workers'
        slope = (d.master_cpu_ms[4] - d.master_cpu_ms[2]) / 2
        assert d.stage_ms == pytest.approx(max(0.0, d.master_cpu_ms[2] - 2 * slope))
    assert prof.stage_overhead_ms == pytest.approx(dispatch[0].stage_ms, abs=1e-4)  # one vCPU's (1769 MB)
    # the no-op at 512 MB against one vCPU: a function's own CPU per invocation (about 0 here, where the test
    # platform gives whole cores; bench perfmodel measures it with the share emulated)
    h = calibrated.calibration.handling
    assert h is not None and (h.memory_mb, h.reference_mb, h.samples) == (512, 1769, 60)
    assert h.handling_ms == pytest.approx(max(0.0, (h.rtt_ms - h.reference_rtt_ms) / (h.stretch - 1)))
    assert prof.handling_ms == pytest.approx(h.handling_ms, abs=1e-4) and prof.handling_ms >= 0
    # the compute probe's repeats: their spread is the tail model's request-wide jitter
    (share,) = calibrated.calibration.cpu_share
    assert share.jitter_sigma > 0 and prof.jitter_sigma == pytest.approx(share.jitter_sigma, abs=1e-4)
    for field in ("invoke_latency_ms", "billed_overhead_ms", "transports", "bandwidth_mb_s", "cold_start_ms",
                  "cpu_share", "dispatch_ms", "handling_ms", "stage_overhead_ms", "jitter_sigma"):
        assert prof.sources[field].startswith("measured by flatpack calibrate on "), field
    where = prof.sources["calibration"]
    assert socket.gethostname() in where and calibrated.provenance.date in where and "flatpack " in where
    assert "60 warm round trips" in prof.sources["invoke_latency_ms"]
    per_size = re.search(r"(\d+) per size", prof.sources["transports"])
    assert per_size is not None and int(per_size.group(1)) >= 7  # more when a loaded machine made it measure again
    # what was not measured is the base profile's, source and all
    assert (prof.price_per_gb_s, prof.memory, prof.mb_per_vcpu, prof.payload_limit_bytes) == (
        base.price_per_gb_s, base.memory, base.mb_per_vcpu, base.payload_limit_bytes)
    assert prof.sources["price_per_gb_s"] == base.sources["price_per_gb_s"]


def test_the_probe_functions_are_removed(calibrated: CalibrationResult, platform: object) -> None:
    from serving.platform.client import PlatformClient

    names = [f["name"] for f in PlatformClient(calibrated.calibration.platform_url).functions()]
    assert not [n for n in names if n.startswith("cal")], names


def test_old_profiles_load_without_the_measured_fields() -> None:
    prof = load_profile("aws-lambda")
    assert prof.transports == {} and prof.cold_start_ms is None and prof.cpu_share == {}
    assert prof.jitter_sigma == 0.0


def test_the_jitter_is_the_spread_of_log_durations_around_each_runs_median() -> None:
    from serving.calibrate.measure import jitter_sigma

    assert jitter_sigma([10.0] * 5, [30.0] * 5) == 0.0  # two sizes, each steady: no jitter, whatever the share
    assert jitter_sigma([10.0, 10.0 * math.e, 10.0 / math.e]) == pytest.approx(1.0)
    assert jitter_sigma([10.0, 11.0]) == 0.0  # too few to say


def _tiny_model(path: Path) -> Path:
    """Conv(3->8, 3x3) + Relu: enough for a plan."""
    w = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
         helper.make_node("Relu", ["c"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        initializer=[numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_plan_takes_the_calibrated_file(calibrated: CalibrationResult, tmp_path: Path) -> None:
    model = _tiny_model(tmp_path / "tiny.onnx")
    runs = {}
    for name in ("local", str(calibrated.path)):
        r = CliRunner().invoke(main, ["plan", str(model), "--platform", name, "--transport", "shm",
                                      "--profile", "flops", "--json"])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads(r.stdout)
    mine, default = runs[str(calibrated.path)], runs["local"]
    assert mine["platform"] == str(calibrated.path)
    assert mine["latency_ms"] != default["latency_ms"]

    # and the performance model holds the calibrated figures
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest, make_perfmodel

    prof = load_profile(calibrated.path)
    pm, _, _ = make_perfmodel(LayerGraph.load(model), PlanRequest(platform=str(calibrated.path), transport="shm",
                                                                   profile="flops"))
    inv = prof.invoke_latency
    assert (pm.platform.invoke.mu, pm.platform.invoke.sigma, pm.platform.invoke.tau) == (
        inv.mu, inv.sigma, inv.tau)
    assert pm.platform.billed_overhead_ms == prof.billed_overhead_ms
    assert pm.platform.bandwidth_mb_s == prof.bandwidth_mb_s == prof.transports["shm"].bandwidth_mb_s
    # the master's CPU per worker and a function's per invocation: measured, not the defaults
    assert (pm.dispatch_at(1769), pm.dispatch_at(512)) == pytest.approx((prof.dispatch_ms[1769], prof.dispatch_ms[512]))
    assert pm.handling_ms == prof.handling_ms
    assert pm.compute.stage_overhead_ms == prof.stage_overhead_ms
    assert pm.platform.jitter_sigma == prof.jitter_sigma > 0


def test_calibrated_profile_reads_this_machines_cache(calibrated: CalibrationResult, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "cache"))
    assert calibrated_profile("local") is None
    path = calibrated_profile_path("local")
    assert path.parent == tmp_path / "cache" / "platforms" and socket.gethostname().split(".")[0] in path.name
    path.parent.mkdir(parents=True)
    shutil.copy(calibrated.path, path)
    cached = calibrated_profile("local")
    assert isinstance(cached, PlatformProfile)
    assert cached.invoke_latency == load_profile(calibrated.path).invoke_latency


def test_a_recalibration_starts_from_a_calibrated_file(calibrated: CalibrationResult, platform: object,
                                                       shm_root: Path, tmp_path: Path) -> None:
    """--platform FILE of an earlier calibration: measured fields replaced again, the rest kept."""
    settings = CalibrationSettings(invoke_samples=5, transfer_samples=3, cold_starts=0, cpu_samples=3,
                                   dispatch_samples=3, sizes=(4 * KIB, 4 * MB), transports=("inline",),
                                   cpu_share_mb=(), evict_bytes=0, shm_dir=shm_root)
    again = calibrate(calibrated.path, output=tmp_path / "again.yaml", url=platform.url,  # type: ignore[attr-defined]
                      settings=settings)
    data = load_profile_data(again.path)
    assert "5 warm round trips" in data["sources"]["invoke_latency_ms"]
    first, second = load_profile(calibrated.path), load_profile(again.path)
    # not measured this time: kept
    assert second.cold_start_ms == first.cold_start_ms and second.cpu_share == first.cpu_share
    assert second.transports["shm"] == first.transports["shm"] and second.bandwidth_mb_s == first.bandwidth_mb_s
    assert second.transports["inline"] != first.transports["inline"]


def test_cli_refuses_a_platform_it_cannot_reach(tmp_path: Path) -> None:
    data = load_profile_data("local")
    data["name"] = "my-cloud"
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(main, ["calibrate", "--platform", str(tmp_path / "mine.yaml")])
    assert r.exit_code != 0
    assert "calibrate measures the platforms it can deploy to" in r.output and "'my-cloud'" in r.output
    r = CliRunner().invoke(main, ["calibrate", "--gateway", "http://127.0.0.1:1"])
    assert r.exit_code == 2 and "--gateway does not apply to --platform local" in r.output


def test_cli_names_a_platform_that_does_not_answer(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = CliRunner().invoke(main, ["calibrate", "--url", f"http://127.0.0.1:{port}", "-o", str(tmp_path / "x.yaml")])
    assert r.exit_code != 0
    assert "no local platform answers" in r.output and "flatpack platform start" in r.output
    assert not (tmp_path / "x.yaml").exists()
