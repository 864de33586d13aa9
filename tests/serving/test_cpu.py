"""The CPU-share arithmetic and the choice of mechanism (serving.platform.cpu), without a platform."""

from __future__ import annotations

import pytest

from serving.platform.cpu import (
    CpuLedger,
    CpuLimitError,
    CpuShare,
    cpu_quota,
    detect,
    make_limiter,
)

V1_MOUNTS = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\ncgroup /nonexistent/memory cgroup rw,memory 0 0\n"
NO_CGROUPS = "proc /proc proc rw 0 0\n"


def test_a_share_is_memory_over_mb_per_vcpu_capped_at_the_cores() -> None:
    assert CpuShare.for_memory(1769, 1769, None, 2) == CpuShare(1.0, 1)
    s = CpuShare.for_memory(512, 1769, None, 2)
    assert s.vcpu == pytest.approx(0.2894, abs=1e-4) and s.threads == 1
    assert CpuShare.for_memory(3008, 1769, None, 2).threads == 2  # 1.7 vCPU: two threads, as Lambda shows two CPUs
    assert CpuShare.for_memory(10240, 1769, None, 2) == CpuShare(2.0, 2)  # this machine's cores
    assert CpuShare.for_memory(10240, 1769, 4, 8).vcpu == 4.0  # the profile's cap


def test_quota_uses_a_short_period_and_never_less_than_the_kernels_minimum() -> None:
    assert cpu_quota(0.2894) == (2894, 10_000)
    assert cpu_quota(1.5) == (15_000, 10_000)
    quota, period = cpu_quota(128 / 1769)  # 0.072 vCPU: 0.72 ms of 10 ms is under the 1 ms minimum
    assert quota == 1000 and period > 10_000 and quota / period == pytest.approx(128 / 1769, rel=0.01)


def test_off_keeps_whole_threads() -> None:
    off = make_limiter("off", mb_per_vcpu=1769, max_vcpu=None, cores=2)
    assert off.name == "off" and off.share(128) == CpuShare(1.0, 1) and off.attach("x", 128).wrap(["a"]) == ["a"]


def test_dilation_hands_the_instance_its_share() -> None:
    lim = make_limiter("dilation", mb_per_vcpu=1769, max_vcpu=None, cores=2)
    limit = lim.attach("f-1", 512)
    assert limit.env == {"FLATPACK_CPU_SHARE": "0.289429"} and limit.wrap(["python"]) == ["python"]


def test_without_cgroups_auto_falls_back_to_dilation_and_an_explicit_cgroup_says_why() -> None:
    assert detect("auto", mounts=NO_CGROUPS, self_cgroup="0::/\n") == "dilation"
    lim = make_limiter("auto", mb_per_vcpu=1769, max_vcpu=None, cores=2, mounts=NO_CGROUPS, self_cgroup="0::/\n")
    assert lim.name == "dilation"
    with pytest.raises(CpuLimitError, match="no cgroup v1 cpu controller is mounted.*dilation"):
        make_limiter("cgroup-v1", mb_per_vcpu=1769, max_vcpu=None, mounts=NO_CGROUPS, self_cgroup="")
    with pytest.raises(CpuLimitError, match="no cgroup2 file system"):
        make_limiter("cgroup-v2", mb_per_vcpu=1769, max_vcpu=None, mounts=NO_CGROUPS, self_cgroup="")
    with pytest.raises(CpuLimitError, match="unknown CPU limit 'fast'"):
        make_limiter("fast", mb_per_vcpu=1769, max_vcpu=None)


def test_the_ledger_counts_invocations_that_start_beyond_the_cores() -> None:
    ledger = CpuLedger(cores=2)
    for _ in range(6):
        ledger.acquire(0.2894)  # six 512 MB functions: 1.74 vCPU, within two cores
    assert ledger.oversubscribed == 0
    ledger.acquire(1.0)
    assert ledger.oversubscribed == 1 and ledger.snapshot()["peak_vcpu"] == pytest.approx(2.736, abs=1e-3)
    for _ in range(7):
        ledger.release(0.5)
    assert ledger.busy_vcpu == 0.0
