"""The calibration's pieces without a platform: the fits, the probe bundles, the settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from functions.bundle import Bundle
from platforms import MB
from serving.calibrate import CalibrationSettings
from serving.calibrate.fit import fit_transfer
from serving.calibrate.probes import (
    FORK_SPLITS,
    compute_model,
    echo_model,
    fork_model,
    noop_model,
    tensors_model,
    write_fork_bundle,
    write_probe_bundle,
)


def test_transfer_fit_recovers_latency_and_bandwidth() -> None:
    sizes = [4096, 65536, MB, 4 * MB, 16 * MB]
    ms = [0.1 + s / (5000 * MB) * 1e3 for s in sizes]
    cost = fit_transfer(sizes, ms)
    assert cost.latency_ms == pytest.approx(0.1, rel=1e-6)
    assert cost.bandwidth_mb_s == pytest.approx(5000, rel=1e-6)


def test_transfer_fit_keeps_latency_non_negative_and_refuses_nonsense() -> None:
    cost = fit_transfer([4096, MB, 4 * MB], [0.0, 0.9, 4.2])
    assert cost.latency_ms == 0.0 and cost.bandwidth_mb_s > 0
    with pytest.raises(ValueError, match="does not grow with size"):
        fit_transfer([4096, MB], [1.0, 0.5])
    with pytest.raises(ValueError, match="at least two sizes"):
        fit_transfer([4096, 4096], [1.0, 1.1])


def _run(bundle: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(bundle / "parts" / "s00_p00.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_probe_bundles_are_valid_bundles(tmp_path: Path) -> None:
    for name, model in (("noop", noop_model()), ("echo", echo_model(4096)), ("compute", compute_model(32, 3))):
        b = Bundle.load(write_probe_bundle(tmp_path / name, model, memory_mb=512))  # checks the manifest's hashes
        assert [f.memory_mb for f in b.plan.functions] == [512]
        assert b.plan.stages[0].parts[0].function == b.plan.master
    x = np.random.default_rng(0).standard_normal((1, 1024)).astype(np.float32)
    np.testing.assert_array_equal(_run(tmp_path / "echo", x), x)
    c = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    y = _run(tmp_path / "compute", c)
    # orthogonal weights keep the norm: the probe's work does not overflow whatever its length
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(c), rel=1e-3)
    with pytest.raises(ValueError, match="multiple of 4"):
        echo_model(4097)


def test_the_tensors_probe_moves_each_of_its_tensors_each_way(tmp_path: Path) -> None:
    b = Bundle.load(write_probe_bundle(tmp_path / "t", tensors_model(3), memory_mb=512))
    assert [t.name for t in b.plan.model.inputs] == ["x0", "x1", "x2"]
    assert [t.name for t in b.plan.model.outputs] == ["y0", "y1", "y2"]
    assert [i.name for i in b.plan.stages[0].parts[0].inputs] == ["x0", "x1", "x2"]
    sess = ort.InferenceSession(str(tmp_path / "t" / "parts" / "s00_p00.onnx"), providers=["CPUExecutionProvider"])
    xs = {f"x{i}": np.full((1, 4), i - 1.0, np.float32) for i in range(3)}
    for i, y in enumerate(sess.run([f"y{i}" for i in range(3)], xs)):
        np.testing.assert_array_equal(y, np.maximum(xs[f"x{i}"], 0))
    with pytest.raises(ValueError, match="at least one"):
        tensors_model(0)


def test_fork_probes_are_verified_bundles_whose_master_only_sends_and_joins(tmp_path: Path) -> None:
    for n in FORK_SPLITS:
        b = Bundle.load(write_fork_bundle(tmp_path / f"fork{n}", fork_model(4, 16), n, memory_mb=1769))
        (stage,) = b.plan.stages
        assert len(stage.parts) == n and all(p.function != b.plan.master for p in stage.parts)
        assert [f.memory_mb for f in b.plan.functions] == [1769] * (n + 1)
    with pytest.raises(ValueError, match="not 3"):
        write_fork_bundle(tmp_path / "fork3", fork_model(4, 16), 3, memory_mb=1769)


def test_settings_scale_from_one_figure_and_check_their_values() -> None:
    s = CalibrationSettings.from_samples(200)
    assert (s.invoke_samples, s.transfer_samples, s.cold_starts, s.cpu_samples) == (200, 20, 5, 40)
    small = CalibrationSettings.from_samples(10, transports=("shm",))
    assert (small.transfer_samples, small.cold_starts, small.cpu_samples, small.transports) == (3, 2, 3, ("shm",))
    with pytest.raises(ValueError, match="cannot calibrate transport"):
        CalibrationSettings(transports=("s3",))
    with pytest.raises(ValueError, match="invoke_samples must be at least 3"):
        CalibrationSettings(invoke_samples=2)


def test_a_calibration_in_a_machines_first_minutes_is_told_to_be_taken_again() -> None:
    from serving.calibrate.provenance import SETTLE_S, Provenance, early_boot_warning

    said = early_boot_warning(300.0)
    assert "booted 5 minute(s) ago" in said and "calibrate again" in said
    assert early_boot_warning(SETTLE_S) == "" and early_boot_warning(None) == ""
    here = Provenance.here()
    assert here.uptime_s is not None and here.uptime_s > 0  # Linux says it
    assert here.to_json()["uptime_s"] == here.uptime_s


def test_this_machines_calibration_is_keyed_by_its_cpu_and_a_clouds_by_its_endpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache directory carried to a clone of this VM on a host with another CPU (the same host name and machine
    id) does not hand it this machine's calibration; a cloud's calibration is named by its endpoint alone."""
    import socket

    import partitioner.profile.cache as profile_cache
    from serving.calibrate import calibrated_profile_path

    here = calibrated_profile_path("local", cache_dir=tmp_path)
    assert here.name.startswith(f"local-{socket.gethostname().split('.')[0]}")
    other = {**profile_cache.machine_info(), "cpu": "Intel(R) Xeon(R)", "id": "0123456789abcdef"}
    monkeypatch.setattr(profile_cache, "machine_info", lambda: other)
    there = calibrated_profile_path("local", cache_dir=tmp_path)
    assert there != here and there.parent == here.parent and there.name.endswith("-01234567.yaml")
    cloud = calibrated_profile_path("aws-lambda", host="eu-west-1", cache_dir=tmp_path)
    assert cloud.name == "aws-lambda-eu-west-1.yaml"


def test_a_machines_first_calibration_takes_as_many_samples_as_flatpack_calibrate() -> None:
    # a deploy's (or a benchmark's) calibration is the one every later plan on the machine is priced with: it
    # must be as precise as the one `flatpack calibrate` writes
    from serving.calibrate import LOCAL_CALIBRATION_SAMPLES
    from serving.cli.calibrate import calibrate_cmd

    samples = next(p for p in calibrate_cmd.params if p.name == "samples")
    assert samples.default == LOCAL_CALIBRATION_SAMPLES
