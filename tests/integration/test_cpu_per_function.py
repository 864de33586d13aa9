"""The local platform emulating a platform that sells CPU per function (OpenFaaS): an instance's cgroup
gets its function's vCPU as its quota and its memory as its limit, apart; the meter bills vCPU-seconds.

Skipped where no cgroup can be written (the quota is then the instance's own dilation, checked by the
environment it is given)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from serving.platform.cpu import detect
from tests.conftest import single_part_bundle, slow_model

CGROUP = next((m for m in ("cgroup-v2", "cgroup-v1") if detect(m) == m), None)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return single_part_bundle(tmp_path_factory.mktemp("chain") / "b", slow_model(n=64, layers=2), function="master")


def _cgroup_dirs(pid: int) -> dict[str, Path]:
    """Per controller (``cpu``, ``memory``; ``""`` for cgroup v2), the directory of ``pid``'s cgroup."""
    mounts = Path("/proc/mounts").read_text().splitlines()
    out: dict[str, Path] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for m in mounts:
            f = m.split()
            if ctrls == "" and f[2] == "cgroup2":
                out[""] = Path(f[1]) / path.lstrip("/")
            elif f[2] == "cgroup" and set(ctrls.split(",")) & {"cpu", "memory"} and set(ctrls.split(",")) <= set(
                    f[3].split(",")):
                for c in set(ctrls.split(",")) & {"cpu", "memory"}:
                    out[c] = Path(f[1]) / path.lstrip("/")
    return out


def _quota_and_memory(pid: int) -> tuple[float, int]:
    """(the CPU quota in cores, the memory limit in bytes) of ``pid``'s cgroup; where the kernel has CFS burst,
    also that the instance may carry one period's unspent quota (the burst equals the quota)."""
    dirs = _cgroup_dirs(pid)
    if CGROUP == "cgroup-v2":
        quota, period = (dirs[""] / "cpu.max").read_text().split()
        if (burst := dirs[""] / "cpu.max.burst").exists():
            assert int(burst.read_text()) == int(quota)
        return int(quota) / int(period), int((dirs[""] / "memory.max").read_text())
    us = int((dirs["cpu"] / "cpu.cfs_quota_us").read_text())
    if (burst := dirs["cpu"] / "cpu.cfs_burst_us").exists():
        assert int(burst.read_text()) == us
    return us / int((dirs["cpu"] / "cpu.cfs_period_us").read_text()), int(
        (dirs["memory"] / "memory.limit_in_bytes").read_text())


def _run(platform, bundle: Path, memory_mb: int, vcpu: float | None) -> tuple[dict, dict, tuple[float, int]]:
    """Deploy, serve one request, and return (the function's description, its meter usage, its instance's
    CPU quota and memory limit)."""
    from serving.platform.deploy import deploy_bundle
    from serving.platform.master_client import MasterClient

    d = deploy_bundle(platform.client, bundle, memory_mb={"master": memory_mb},
                      vcpu=None if vcpu is None else {"master": vcpu})
    client = MasterClient(d, platform.url, timeout_s=120)
    try:
        client.infer({"x": np.ones((64, 64), np.float32)})
        name = d.names["master"]
        fn = platform.client.function(name)
        (inst,) = fn["instances"]
        return fn, platform.client.meter()["functions"][name], _quota_and_memory(inst["pid"])
    finally:
        client.close()
        d.remove()


@pytest.mark.skipif(CGROUP is None, reason="no writable cgroup here")
@pytest.mark.parametrize(("memory_mb", "vcpu"), [(2048, 0.5), (256, 1.5), (512, None)])
def test_an_instance_gets_its_functions_cpu_whatever_its_memory(chain: Path, shm_root: Path, memory_mb: int,
                                                                vcpu: float | None) -> None:
    from platforms import load_profile
    from serving.platform import LocalPlatform, PlatformConfig

    profile = load_profile("openfaas")
    want = min(vcpu if vcpu is not None else profile.cpu.default_vcpu or 1.0, float(os.cpu_count() or 1))
    with LocalPlatform(PlatformConfig(port=0, shm_dir=shm_root, cpu_limit=CGROUP, profile="openfaas")) as p:
        assert p.client.health()["cpu"]["cpu_model"] == "per_function"
        fn, usage, (quota, memory) = _run(p, chain, memory_mb, vcpu)
    assert quota == pytest.approx(want, rel=1e-3)  # not memory_mb / mb_per_vcpu
    assert memory == memory_mb * 2**20
    assert fn["share_vcpu"] == pytest.approx(want, rel=1e-3) and fn["vcpu"] == pytest.approx(want)
    assert fn["intra_op_threads"] == max(1, -(-want // 1))
    # metered: GB-s as on Lambda, and the vCPU it held for the billed time
    assert usage["vcpu"] == pytest.approx(want)
    assert usage["billed_vcpu_s"] == pytest.approx(want * usage["billed_ms"] / 1000)
    assert usage["billed_gb_s"] == pytest.approx(memory_mb / 1024 * usage["billed_ms"] / 1000)


def test_a_vcpu_outside_the_profiles_range_or_where_cpu_follows_memory_is_refused(shm_root: Path) -> None:
    from serving.platform import FunctionSpec, LocalPlatform, PlatformConfig

    with LocalPlatform(PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="dilation", profile="openfaas")) as p:
        with pytest.raises(ValueError, match=r"vcpu 0\.05 is not offered: choose 0\.1\.\.8 vCPU"):
            p.client.register(FunctionSpec("tiny", memory_mb=256, vcpu=0.05))
        d = p.client.register(FunctionSpec("half", memory_mb=4096, vcpu=0.5))
        assert d["vcpu"] == 0.5 and d["share_vcpu"] == 0.5 and d["intra_op_threads"] == 1
    with LocalPlatform(PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="dilation")) as p:
        assert p.client.health()["cpu"]["cpu_model"] == "follows_memory"
        with pytest.raises(ValueError, match="follows memory"):
            p.client.register(FunctionSpec("half", memory_mb=1769, vcpu=0.5))
        d = p.client.register(FunctionSpec("lambda", memory_mb=1769))
        assert d["vcpu"] is None and d["share_vcpu"] == pytest.approx(1.0)


def test_status_names_the_cpu_model(shm_root: Path) -> None:
    from serving.cli import main
    from serving.platform import LocalPlatform, PlatformConfig

    for profile, model in (("openfaas", "per_function"), ("local", "follows_memory")):
        with LocalPlatform(PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="dilation", profile=profile)) as p:
            out = CliRunner().invoke(main, ["platform", "status", "--url", p.url, "--json"])
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["cpu_model"] == model


def test_platform_start_emulates_the_platform_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.cli import main
    from tests.conftest import free_port

    monkeypatch.setenv("FLATPACK_STATE_DIR", str(tmp_path))
    cli = CliRunner()
    bad = cli.invoke(main, ["platform", "start", "--platform", "openfaas", "--profile", "local"])
    assert bad.exit_code == 2 and "disagree" in bad.output
    unknown = cli.invoke(main, ["platform", "start", "--platform", "gcf"])
    assert unknown.exit_code == 2 and "no platform profile 'gcf'" in unknown.output
    port = free_port()
    out = cli.invoke(main, ["platform", "start", "--platform", "openfaas", "--port", str(port),
                            "--cpu-limit", "dilation"])
    assert out.exit_code == 0, out.output
    try:
        status = json.loads(cli.invoke(main, ["platform", "status", "--json"]).output)
        assert status["cpu_model"] == "per_function" and status["health"]["profile"] == "openfaas"
    finally:
        assert cli.invoke(main, ["platform", "stop"]).exit_code == 0
