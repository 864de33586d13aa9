"""The machine's other load while a benchmark runs, and how much parallelism it leaves.

On a shared machine other users' processes take CPU from the functions under test. Linux schedules by
*autogroup* when ``kernel.sched_autogroup_enabled`` is 1 (the default on desktops and on this machine):
every session (``setsid``) is a group, and runnable groups share the cores fairly whatever their thread
counts. The local platform starts every function instance in a session of its own, so each instance
competes as one group. The simulator's processor-sharing CPU therefore models other load as a number of
always-busy background groups; :class:`BackgroundSampler` measures it: every ``interval_s`` it counts the
distinct autogroups (sessions, without autogroup) that have a runnable thread and are not the
benchmark's own (this process, the platform process and its children, the function instances).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["BackgroundSampler", "active_groups", "parallel_speedup", "runnable_threads"]


def _autogroup(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except (OSError, IndexError):
        try:  # no autogroup: the session stands for the group
            return "sid-" + Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]
        except (OSError, IndexError):
            return None


def _runnable(pid: int) -> bool:
    """Whether any thread of ``pid`` is in state R."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    if fields[0] == "R":
        return True
    if int(fields[17]) <= 1:  # num_threads
        return False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "R":
                    return True
        except (OSError, IndexError):
            continue
    return False


def active_groups(exclude_pids: list[int]) -> int:
    """Scheduling groups with a runnable thread now, not counting the groups of ``exclude_pids``."""
    mine = {g for p in exclude_pids if (g := _autogroup(p)) is not None}
    groups: set[str] = set()
    self_pid = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == self_pid or not _runnable(pid):
            continue
        g = _autogroup(pid)
        if g is not None and g not in mine:
            groups.add(g)
    return len(groups)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            except (OSError, ValueError):
                continue
    except OSError:
        pass
    return out


def runnable_threads(pids: list[int]) -> int:
    """Threads of ``pids`` in state R (running or waiting for a CPU) right now."""
    n = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "R":
                        n += 1
            except (OSError, IndexError):
                continue
    return n


class BackgroundSampler:
    """``with BackgroundSampler(platform_pid) as bg: ...; bg.mean`` — the average number of other runnable
    scheduling groups (see the module docstring) while the block ran."""

    def __init__(self, platform_pid: int | None, *, interval_s: float = 0.2) -> None:
        self.platform_pid = platform_pid
        self.interval_s = interval_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _ours(self) -> list[int]:
        pids = [os.getpid()]
        if self.platform_pid:
            pids.append(self.platform_pid)
            pids += _children(self.platform_pid)
        return pids

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append(active_groups(self._ours()))
            except OSError:
                continue

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0

    def __enter__(self) -> BackgroundSampler:
        self._thread = threading.Thread(target=self._run, name="flatpack-background", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)


def _spin(n: int) -> float:
    import time

    t = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i
    return time.perf_counter() - t


def _own_session() -> None:
    os.setsid()


def parallel_speedup(n: int = 3_000_000, workers: int | None = None) -> float:
    """How much faster ``workers`` (default: the cores) CPU-bound processes get through ``workers`` equal
    jobs than one process gets through one, now: ``workers`` on an idle machine, less when other load
    takes the cores. Each process runs in a session of its own, as function instances do, so each is
    its own scheduling group. A split plan cannot be faster than this allows."""
    import multiprocessing as mp
    import time

    k = workers or os.cpu_count() or 1
    ctx = mp.get_context("fork")
    with ctx.Pool(k, initializer=_own_session) as pool:
        pool.map(_spin, [1000] * k)  # start the workers before timing
        t = time.perf_counter()
        pool.map(_spin, [n])
        one = time.perf_counter() - t
        t = time.perf_counter()
        pool.map(_spin, [n] * k, chunksize=1)
        many = time.perf_counter() - t
    return k * one / many if many > 0 else float("nan")
