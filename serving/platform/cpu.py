"""CPU as the platform sells it: an instance gets the share of a core its memory buys, or its own.

The profile's CPU model (``platforms.CpuModel``) says which. ``follows_memory`` (Lambda, the default
local profile): the share is the memory's, as below. ``per_function`` (OpenFaaS, Kubernetes): each
function's CPU is its own setting (``FunctionSpec.vcpu``, else the profile's ``default_vcpu``), whatever
its memory; the instance's quota is that many cores and its memory limit is its memory, apart.

AWS Lambda gives a function ``memory_mb / 1769`` vCPUs (a 128 MB function 0.07 of one, a 512 MB one 0.29).
The local platform emulates the profile's ``mb_per_vcpu`` so that a plan behaves here as it would there:
an instance of M MB computes with ``M / mb_per_vcpu`` of a core (capped at this machine's cores and the
profile's ``max_vcpu``) and runs ``ceil`` of that many onnxruntime threads. Mechanisms, best first:

``cgroup-v2``
    A cgroup per instance (under the platform's own) with ``cpu.max`` = quota and a short period, and
    ``memory.max`` = its memory size.
``cgroup-v1``
    The same with the v1 ``cpu`` controller (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) and the
    ``memory`` controller (``memory.limit_in_bytes``).
``dilation``
    Where cgroups cannot be written (not root and nothing delegated, macOS): the instance stretches its own
    time. After each request (and after starting) it waits until its wall time is its CPU time divided by
    its share. It models a share on an idle machine. It does not model the burstiness of a real quota.
``off``
    The old behaviour: whole threads (``platforms.threads_for``, the ceiling of the vCPUs) and no limit.
    Plans for the local profile assume a share, so ``off`` is for debugging only.

The period is short (10 ms): with the kernel's default 100 ms a 29 % quota runs a 15 ms inference as
bursts of 29 ms on and 71 ms off, and it took 87 ms instead of the 52 ms its share buys. With 10 ms it
took 59 ms. The kernel's smallest quota is 1 ms, so a share below 10 % gets a longer period.

A quota still rounds by its period: a request that starts late in a period uses the rest of that
period's quota and then the next one's. The last chunk of work does not wait out its period, either. So
a 22 ms (one core) piece of work took 29-33 ms at 1024 MB instead of the 38 ms its 0.58 vCPU buy (flatpack
bench cpushare). Shorter periods cost more than they fix: at 2 ms the throttling overhead made even the
unthrottled 1769 MB reference 40 % slower. So the cgroup instances also dilate, as the fallback does, and
this is only a top-up: after a request the instance waits until its wall time is its CPU time over its
share. On an idle machine that removes the period's rounding. When the instance is contended the quota
has already made it slower than that, and the top-up adds nothing. The quota is what keeps concurrent
instances to their shares; the top-up is what makes one instance's time exact.

The top-up counts a request's time from when the platform handed it to the instance, not from when the
instance got a core to read it. A function owns its share from the moment its invocation arrives; on a host
with fewer cores than a stage has parts, the parts invoked last wait for a core first, and a top-up counted
from their own start charged that wait twice (a 6-part vgg11/w2 stage at 512 MB on 2 cores: the last part
read its input 6-10 ms after the hand-over, then waited out its whole share). A request still lasts at least
its CPU over its share from the hand-over, and at least what the host allows.

An instance that waits (a master while its workers compute) leaves its quota unspent, and without more
it woke to a spent quota: a 0.29 vCPU master's replies were read up to one period late, at each stage. So
each instance may also carry one period's unspent quota into the next (CFS burst, ``cpu.cfs_burst_us`` or
``cpu.max.burst``, equal to its quota; kernels from 5.14). The top-up above still makes every request last
at least its CPU over its share, so an instance gets no more CPU than its share buys over a request; it
only stops the period from rounding the time between its bursts. On vgg16 (width/2, 224 px) split over 11
functions at 512 MB, ``flatpack bench lo``'s plan answered in 68 ms rather than 80 ms.

The platform's RSS watchdog stays: a cgroup's memory limit is the hard backstop, and an instance the
kernel killed for memory is reported as out of memory, with its cgroup's peak usage.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from functions.procstat import pid_alive
from platforms.profile import threads_for, vcpus_for

__all__ = [
    "CPU_LIMITS",
    "CpuLedger",
    "CpuLimitError",
    "CpuLimiter",
    "CpuShare",
    "InstanceLimit",
    "cpu_quota",
    "detect",
    "make_limiter",
]

log = logging.getLogger(__name__)

CpuLimitName = Literal["auto", "cgroup", "cgroup-v2", "cgroup-v1", "dilation", "off"]
CPU_LIMITS: tuple[str, ...] = ("auto", "cgroup", "cgroup-v2", "cgroup-v1", "dilation", "off")

PERIOD_US = 10_000  # 10 ms: see the module docstring
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller quota
MAX_PERIOD_US = 1_000_000

_JOIN_SCRIPT = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; n=$((n-1)); done; exec "$@"'


class CpuLimitError(RuntimeError):
    """The requested CPU-limit mechanism cannot be used on this machine."""


@dataclass(frozen=True)
class CpuShare:
    """What an instance of ``memory_mb`` gets: ``vcpu`` cores' worth of CPU time and ``threads`` threads."""

    vcpu: float
    threads: int

    @classmethod
    def for_memory(cls, memory_mb: float, mb_per_vcpu: float, max_vcpu: float | None, cores: int) -> CpuShare:
        return cls(vcpus_for(memory_mb, mb_per_vcpu, max_vcpu, cores=cores),
                   threads_for(memory_mb, mb_per_vcpu, max_vcpu, cores=cores))

    @classmethod
    def for_vcpu(cls, vcpu: float, cores: int) -> CpuShare:
        """A function's own CPU (a per_function platform), capped by this machine's ``cores``."""
        v = min(float(vcpu), float(cores))
        return cls(v, max(1, math.ceil(v - 1e-9)))


def cpu_quota(vcpu: float) -> tuple[int, int]:
    """(quota_us, period_us) for ``vcpu`` cores: a 10 ms period, longer where the quota would be under 1 ms."""
    period = PERIOD_US
    if vcpu * period < MIN_QUOTA_US:
        period = min(MAX_PERIOD_US, math.ceil(MIN_QUOTA_US / max(vcpu, 1e-6)))
    return max(MIN_QUOTA_US, round(vcpu * period)), period


@dataclass
class InstanceLimit:
    """The limit of one instance: how to start it inside the limit, and what its cgroup saw."""

    env: dict[str, str] = field(default_factory=dict)
    dirs: list[Path] = field(default_factory=list)  # its cgroups (removed when it is gone)
    procs: list[Path] = field(default_factory=list)  # their cgroup.procs files, which it joins as it starts
    memory_dir: Path | None = None
    memory_version: int = 0  # 1 or 2 when memory_dir is set

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` started inside the limit: by a shell that joins :attr:`procs` first, where there are any."""
        return [*_join_prefix(self.procs), *argv] if self.procs else list(argv)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this cgroup for memory."""
        if self.memory_dir is None:
            return False
        name = "memory.events" if self.memory_version == 2 else "memory.oom_control"
        for line in _read(self.memory_dir / name).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                return True
        return False

    def peak_mb(self) -> float:
        """The cgroup's peak memory use (MB; 0 where the kernel does not say)."""
        if self.memory_dir is None:
            return 0.0
        name = "memory.peak" if self.memory_version == 2 else "memory.max_usage_in_bytes"
        raw = _read(self.memory_dir / name).strip()
        return int(raw) / 2**20 if raw.isdigit() else 0.0

    def release(self) -> None:
        """Remove its cgroups (once its processes are gone; a busy one is retried by the platform's sweep)."""
        for d in reversed(self.dirs):
            with contextlib.suppress(FileNotFoundError, OSError):
                d.rmdir()


class CpuLimiter:
    """One mechanism (see the module docstring); ``name`` is what ``flatpack platform status`` shows."""

    name = "off"

    def __init__(self, mb_per_vcpu: float, max_vcpu: float | None, cores: int | None = None, *,
                 cpu_model: str = "follows_memory") -> None:
        self.mb_per_vcpu = mb_per_vcpu
        self.max_vcpu = max_vcpu
        self.cores = cores or os.cpu_count() or 1
        self.cpu_model = cpu_model

    def share(self, memory_mb: float, vcpu: float | None = None) -> CpuShare:
        """What an instance gets: ``vcpu`` cores where its function sets its own CPU (a per_function
        platform; the caller resolves the profile's default), else the share ``memory_mb`` buys."""
        share = (CpuShare.for_vcpu(vcpu, self.cores) if vcpu is not None
                 else CpuShare.for_memory(memory_mb, self.mb_per_vcpu, self.max_vcpu, self.cores))
        if self.name == "off":  # the old behaviour: whole threads, at least one
            return CpuShare(float(share.threads), share.threads)
        return share

    def attach(self, instance: str, memory_mb: int, vcpu: float | None = None) -> InstanceLimit:
        """The limit for a new instance (``instance``: a name unique on this platform): CPU as
        :meth:`share` gives it, memory ``memory_mb`` whatever its CPU."""
        return InstanceLimit()

    @property
    def holds_memory(self) -> bool:
        """Whether every instance it attaches is held to its memory by the kernel (a memory cgroup)."""
        return False

    def close(self) -> None:
        """Remove what the limiter created."""

    def describe(self) -> dict[str, object]:
        return {"cpu_limit": self.name, "cpu_model": self.cpu_model, "cores": self.cores,
                "mb_per_vcpu": self.mb_per_vcpu if self.cpu_model == "follows_memory" else None,
                "period_us": PERIOD_US if self.name.startswith("cgroup") else None}


class DilationLimiter(CpuLimiter):
    """The instance stretches its own wall time to CPU time / share (``FLATPACK_CPU_SHARE``)."""

    name = "dilation"

    def attach(self, instance: str, memory_mb: int, vcpu: float | None = None) -> InstanceLimit:
        return InstanceLimit(env=_top_up(self.share(memory_mb, vcpu)))


class _CgroupLimiter(CpuLimiter):
    """Shared by v1 and v2: a directory per instance under ``flatpack-<pid>`` in the platform's own cgroup."""

    def __init__(self, mb_per_vcpu: float, max_vcpu: float | None, cores: int | None = None, *,
                 cpu_root: Path, memory_root: Path | None, cpu_model: str = "follows_memory") -> None:
        super().__init__(mb_per_vcpu, max_vcpu, cores, cpu_model=cpu_model)
        self.cpu_root = cpu_root
        self.memory_root = memory_root
        _sweep_stale(r for r in (cpu_root, memory_root) if r is not None)
        self.cpu_base = _mkdir(cpu_root / f"flatpack-{os.getpid()}")
        self.memory_base = _mkdir(memory_root / f"flatpack-{os.getpid()}") if memory_root is not None else None

    @property
    def holds_memory(self) -> bool:
        return self.memory_base is not None

    def close(self) -> None:
        for base in (self.cpu_base, self.memory_base):
            if base is not None:
                _remove_cgroups(base)


class CgroupV1Limiter(_CgroupLimiter):
    name = "cgroup-v1"

    def attach(self, instance: str, memory_mb: int, vcpu: float | None = None) -> InstanceLimit:
        share = self.share(memory_mb, vcpu)
        quota, period = cpu_quota(share.vcpu)
        cpu = _mkdir(self.cpu_base / instance)
        # the period first: a quota is checked against the current period
        _write(cpu / "cpu.cfs_period_us", str(period))
        _write(cpu / "cpu.cfs_quota_us", str(quota))
        # a kernel without CFS burst (before 5.14) has no file: the quota alone, as before
        _write(cpu / "cpu.cfs_burst_us", str(quota), missing_ok=True)
        dirs, procs = [cpu], [cpu / "cgroup.procs"]
        limit = InstanceLimit(dirs=dirs, env=_top_up(share))
        if self.memory_base is not None:
            mem = _mkdir(self.memory_base / instance)
            _write(mem / "memory.limit_in_bytes", str(memory_mb * 2**20))
            # Lambda has no swap: where swap is accounted, the limit covers it too (else a host with swap
            # would page the instance out instead of ending it)
            with contextlib.suppress(CpuLimitError):
                _write(mem / "memory.memsw.limit_in_bytes", str(memory_mb * 2**20), missing_ok=True)
            dirs.append(mem)
            procs.append(mem / "cgroup.procs")
            limit.memory_dir, limit.memory_version = mem, 1
        limit.procs = procs
        return limit


class CgroupV2Limiter(_CgroupLimiter):
    name = "cgroup-v2"

    def __init__(self, mb_per_vcpu: float, max_vcpu: float | None, cores: int | None = None, *,
                 root: Path, cpu_model: str = "follows_memory") -> None:
        super().__init__(mb_per_vcpu, max_vcpu, cores, cpu_root=root, memory_root=None, cpu_model=cpu_model)
        controllers = set(_read(root / "cgroup.controllers").split())
        self.memory = "memory" in controllers
        enable = "+cpu" + (" +memory" if self.memory else "")
        # the controllers must be enabled on the way down: in the platform's cgroup (refused while it holds
        # processes itself, unless it is the root: then no v2 here) and in flatpack-<pid>
        if enable.split()[0].removeprefix("+") not in _read(root / "cgroup.subtree_control").split():
            _write(root / "cgroup.subtree_control", enable)
        _write(self.cpu_base / "cgroup.subtree_control", enable)

    def attach(self, instance: str, memory_mb: int, vcpu: float | None = None) -> InstanceLimit:
        share = self.share(memory_mb, vcpu)
        quota, period = cpu_quota(share.vcpu)
        d = _mkdir(self.cpu_base / instance)
        _write(d / "cpu.max", f"{quota} {period}")
        _write(d / "cpu.max.burst", str(quota), missing_ok=True)  # after cpu.max: a burst is checked against it
        limit = InstanceLimit(dirs=[d], procs=[d / "cgroup.procs"], env=_top_up(share))
        if self.memory:
            _write(d / "memory.max", str(memory_mb * 2**20))
            with contextlib.suppress(CpuLimitError):  # no swap, as on Lambda (see CgroupV1Limiter)
                _write(d / "memory.swap.max", "0", missing_ok=True)
            limit.memory_dir, limit.memory_version = d, 2
        return limit

    @property
    def holds_memory(self) -> bool:
        return self.memory


def make_limiter(kind: str, *, mb_per_vcpu: float, max_vcpu: float | None, cores: int | None = None,
                 mounts: str | None = None, self_cgroup: str | None = None,
                 cpu_model: str = "follows_memory") -> CpuLimiter:
    """The limiter for ``kind`` (one of :data:`CPU_LIMITS`): ``auto`` takes the first that works of
    cgroup-v2, cgroup-v1, dilation; ``cgroup`` the first of v2, v1. An explicit mechanism that cannot be
    used raises :class:`CpuLimitError` saying why. ``mounts`` / ``self_cgroup``: the text of
    /proc/mounts and /proc/self/cgroup (for tests). ``cpu_model``: the profile's (shown by
    :meth:`CpuLimiter.describe`; the share itself comes from the vCPU each attach is given)."""
    if kind not in CPU_LIMITS:
        raise CpuLimitError(f"unknown CPU limit {kind!r}; choose one of {', '.join(CPU_LIMITS)}")
    if kind == "off":
        return CpuLimiter(mb_per_vcpu, max_vcpu, cores, cpu_model=cpu_model)
    if kind == "dilation":
        return DilationLimiter(mb_per_vcpu, max_vcpu, cores, cpu_model=cpu_model)
    order = ["cgroup-v2", "cgroup-v1"] if kind in ("auto", "cgroup") else [kind]
    mounts = _read(Path("/proc/mounts")) if mounts is None else mounts
    own = _read(Path("/proc/self/cgroup")) if self_cgroup is None else self_cgroup
    why: list[str] = []
    for name in order:
        try:
            if name == "cgroup-v2":
                return CgroupV2Limiter(mb_per_vcpu, max_vcpu, cores, root=_v2_root(mounts, own), cpu_model=cpu_model)
            cpu_root, mem_root = _v1_roots(mounts, own)
            return CgroupV1Limiter(mb_per_vcpu, max_vcpu, cores, cpu_root=cpu_root, memory_root=mem_root,
                                   cpu_model=cpu_model)
        except (CpuLimitError, OSError) as e:
            why.append(f"{name}: {e}")
    if kind == "auto":
        log.info("no cgroup can be written (%s); emulating CPU shares by dilation", "; ".join(why))
        return DilationLimiter(mb_per_vcpu, max_vcpu, cores, cpu_model=cpu_model)
    raise CpuLimitError(f"CPU limit {kind!r} is not available here ({'; '.join(why)}); run the platform as "
                        f"root or in a delegated cgroup, or use cpu_limit 'dilation'")


def detect(kind: str = "auto", *, mounts: str | None = None, self_cgroup: str | None = None) -> str:
    """The mechanism ``make_limiter(kind)`` would pick on this machine, found without creating anything."""
    if kind in ("off", "dilation"):
        return kind
    mounts = _read(Path("/proc/mounts")) if mounts is None else mounts
    own = _read(Path("/proc/self/cgroup")) if self_cgroup is None else self_cgroup
    order = ["cgroup-v2", "cgroup-v1"] if kind in ("auto", "cgroup") else [kind]
    for name in order:
        try:
            _v2_root(mounts, own) if name == "cgroup-v2" else _v1_roots(mounts, own)
            return name
        except CpuLimitError:
            continue
    return "dilation" if kind == "auto" else "unavailable"


class CpuLedger:
    """The CPU that busy instances are entitled to, against this machine's cores: when it exceeds them
    the scale model no longer holds (the instances slow each other down, which on Lambda they would not)."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.busy_vcpu = 0.0
        self.peak_vcpu = 0.0
        self.invocations = 0
        self.oversubscribed = 0  # invocations that started while the shares exceeded the cores

    def acquire(self, vcpu: float) -> None:
        self.busy_vcpu += vcpu
        self.invocations += 1
        self.peak_vcpu = max(self.peak_vcpu, self.busy_vcpu)
        if self.busy_vcpu > self.cores + 1e-9:
            self.oversubscribed += 1

    def release(self, vcpu: float) -> None:
        self.busy_vcpu = max(0.0, self.busy_vcpu - vcpu)

    def snapshot(self) -> dict[str, float | int]:
        return {"cores": self.cores, "busy_vcpu": round(self.busy_vcpu, 3), "peak_vcpu": round(self.peak_vcpu, 3),
                "invocations": self.invocations, "oversubscribed_invocations": self.oversubscribed}


# -- cgroup file system ---------------------------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str, *, missing_ok: bool = False) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except FileNotFoundError:
        if not missing_ok:
            raise
    except OSError as e:
        raise CpuLimitError(f"cannot write {value!r} to {path}: {os.strerror(e.errno or errno.EIO)}") from e


def _mkdir(path: Path) -> Path:
    try:
        path.mkdir(exist_ok=True)
    except OSError as e:
        raise CpuLimitError(f"cannot create {path}: {os.strerror(e.errno or errno.EIO)}") from e
    return path


def _top_up(share: CpuShare) -> dict[str, str]:
    """The instance's own dilation (see the module docstring): the whole mechanism where no cgroup can be
    written, the top-up of a quota's period granularity where one can."""
    return {"FLATPACK_CPU_SHARE": f"{share.vcpu:.6f}"}


def _join_prefix(procs: Sequence[Path]) -> list[str]:
    """A shell that moves itself into each cgroup, then becomes the instance: the instance starts (and its
    cold start runs) inside the limit."""
    sh = shutil.which("sh") or "/bin/sh"
    return [sh, "-c", _JOIN_SCRIPT, "flatpack-cgroup", str(len(procs)), *map(str, procs)]


def _own_path(self_cgroup: str, match: Iterable[str] | None) -> str:
    """The platform's own cgroup path in a hierarchy: v2 (``match`` None) or v1 with those controllers."""
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if match is None and hid == "0" and ctrls == "":
            return path
        if match is not None and set(match) <= set(ctrls.split(",")):
            return path
    return "/"


def _v2_root(mounts: str, own: str) -> Path:
    for line in mounts.splitlines():
        f = line.split()
        if len(f) >= 3 and f[2] == "cgroup2":
            root = Path(f[1]) / _own_path(own, None).lstrip("/")
            if "cpu" not in _read(root / "cgroup.controllers").split():
                raise CpuLimitError(f"the cpu controller is not enabled in {root} (cgroup.controllers)")
            if not os.access(root, os.W_OK):
                raise CpuLimitError(f"{root} is not writable")
            return root
    raise CpuLimitError("no cgroup2 file system is mounted")


def _v1_roots(mounts: str, own: str) -> tuple[Path, Path | None]:
    cpu: Path | None = None
    mem: Path | None = None
    for line in mounts.splitlines():
        f = line.split()
        if len(f) < 4 or f[2] != "cgroup":
            continue
        opts = set(f[3].split(","))
        if "cpu" in opts and cpu is None:
            cpu = Path(f[1]) / _own_path(own, ["cpu"]).lstrip("/")
        if "memory" in opts and mem is None:
            mem = Path(f[1]) / _own_path(own, ["memory"]).lstrip("/")
    if cpu is None:
        raise CpuLimitError("no cgroup v1 cpu controller is mounted")
    if not (cpu / "cpu.cfs_quota_us").exists():
        raise CpuLimitError(f"{cpu} has no cpu.cfs_quota_us (kernel without CFS bandwidth control)")
    if not os.access(cpu, os.W_OK):
        raise CpuLimitError(f"{cpu} is not writable")
    if mem is not None and not os.access(mem, os.W_OK):
        log.info("%s is not writable: memory limits stay with the RSS watchdog alone", mem)
        mem = None
    return cpu, mem


def _sweep_stale(roots: Iterable[Path]) -> None:
    """Remove ``flatpack-<pid>`` cgroups whose platform died without cleaning up."""
    for root in roots:
        with contextlib.suppress(OSError):
            for d in root.glob("flatpack-*"):
                pid = d.name.removeprefix("flatpack-")
                if not pid.isdigit() or pid_alive(int(pid)):
                    continue
                _remove_cgroups(d)


def _remove_cgroups(base: Path) -> None:
    """Remove ``base`` and the instance cgroups in it (a cgroup is removed by rmdir, once it holds no process;
    one that still does stays, and is swept by a later platform)."""
    with contextlib.suppress(OSError):
        for child in base.iterdir():
            if child.is_dir():
                with contextlib.suppress(OSError):
                    child.rmdir()
        base.rmdir()
