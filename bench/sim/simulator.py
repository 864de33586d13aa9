"""A discrete-event simulation of a serverless platform serving fork-join plans.

What it models (times in ms):

* **Functions and instances** (Lambda semantics, as :mod:`serving.platform.pool`): an instance serves one
  invocation at a time; an invocation that finds no idle instance starts one (a cold start of
  ``cold_start_ms``) unless ``concurrency`` instances exist, in which case it waits in FIFO order; an
  instance idle for longer than ``idle_timeout_ms`` is reaped, so the next invocation is a cold start.
* **Invoke latency**: each invocation's round trip draws from an exponentially modified Gaussian
  (Gillis), as in the platform profile.
* **CPU**: a function's work is CPU time at its thread count. On a platform with dedicated CPUs (the
  cloud) work simply takes its time. On the local platform every function shares the machine's cores,
  and queueing for them is what latency under load comes from there: :class:`TimeSliceCpu` (the default
  there, ``time_slice_ms``) serves per-core run queues in time slices as the operating system does;
  :class:`CpuPool` is egalitarian processor sharing (each busy thread gets ``min(1, cores / (busy threads
  + background))`` of a core). Either can add ``background`` always-busy threads standing for other load.
  Processor sharing gets the mean right but puts a closed loop's requests in step, every worker running
  while the others' do, which bills workers half as long again as a real machine does under load.
  A function below one vCPU (``SimPlan.shares``: M / mb_per_vcpu of its thread's time, as Lambda sells
  it and the local platform's quota enforces it) runs at that share, and the cores slow it down further
  only when the busy functions' shares add up to more than they have (capped processor sharing in
  :class:`CpuPool`; a plan with shares is simulated there, time slices model whole-core functions).
* **Billing**: each invocation is billed for its duration rounded up to the granularity, times its
  memory (the master for the whole request, each worker for its own part), plus a fee per invocation;
  start-up is not billed (as the local meter).
* **Plans** (:class:`SimPlan`): a chain of stages; per stage the master puts the workers' inputs, invokes
  them, runs its own part meanwhile, waits for the slowest, gets the outputs and joins.

The kernel is a tiny process-based event loop (generators yielding events, as in SimPy) so the model
code reads as the request's timeline.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from platforms import ExGauss, billed_ms

__all__ = [
    "CpuPool",
    "Event",
    "Kernel",
    "SimFunction",
    "SimPlan",
    "SimPlatform",
    "SimResult",
    "SimStage",
    "SimWorker",
    "TIME_SLICE_MS",
    "TimeSliceCpu",
    "simulate",
]


# -- the kernel ------------------------------------------------------------------------------------------


class Event:
    """Something that happens once; processes wait on it by yielding it."""

    __slots__ = ("callbacks", "kernel", "triggered", "value")

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.callbacks: list[Callable[[Event], None]] = []
        self.triggered = False
        self.value: Any = None

    def succeed(self, value: Any = None) -> Event:
        if self.triggered:
            raise RuntimeError("event triggered twice")
        self.triggered = True
        self.value = value
        for cb in self.callbacks:
            self.kernel.call_soon(cb, self)
        self.callbacks = []
        return self

    def on(self, cb: Callable[[Event], None]) -> None:
        if self.triggered:
            self.kernel.call_soon(cb, self)
        else:
            self.callbacks.append(cb)


class Process(Event):
    """Runs a generator; the process (an event) succeeds with the generator's return value."""

    __slots__ = ("gen",)

    def __init__(self, kernel: Kernel, gen: Generator[Event, Any, Any]) -> None:
        super().__init__(kernel)
        self.gen = gen
        kernel.call_soon(self._step, None)

    def _step(self, ev: Event | None) -> None:
        try:
            target = self.gen.send(None if ev is None else ev.value)
        except StopIteration as stop:
            self.succeed(stop.value)
            return
        target.on(self._step)


class Kernel:
    """The event loop: a clock (ms) and a heap of timed callbacks."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., object], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def call_at(self, t: float, fn: Callable[..., object], *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        self.call_at(self.now, fn, *args)

    def timeout(self, delay_ms: float, value: Any = None) -> Event:
        ev = Event(self)
        self.call_at(self.now + max(0.0, delay_ms), ev.succeed, value)
        return ev

    def process(self, gen: Generator[Event, Any, Any]) -> Process:
        return Process(self, gen)

    def all_of(self, events: Sequence[Event]) -> Event:
        done = Event(self)
        left = [len(events)]
        if not events:
            return done.succeed([])

        def one(_: Event) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.succeed([e.value for e in events])

        for e in events:
            e.on(one)
        return done

    def run(self, until: float | None = None) -> None:
        while self._heap:
            t, _, fn, args = self._heap[0]
            if until is not None and t > until:
                self.now = until
                return
            heapq.heappop(self._heap)
            self.now = t
            fn(*args)


# -- resources -------------------------------------------------------------------------------------------

# The time slice of the local platform's simulated scheduler (ms). Linux's fair scheduler gives a runnable
# thread a slice of 0.75 ms x (1 + log2 cores) (1.5 ms on 2 cores), which the timer tick (4 ms at 250 Hz)
# stretches; 3 ms sits between. `flatpack bench sim --validate` on a 2-core VM: 1.5 and 3 kept the
# workers' billed time under load within 10 % of the meter, and the closed loop's p50 too; 6 made the p50
# 17 % slow; processor sharing (0) billed the workers 50-60 % over.
TIME_SLICE_MS = 3.0


class CpuPool:
    """Processor sharing over ``cores`` cores (None: unlimited, every job at full speed), with CPU shares.

    A job is ``work_ms`` of CPU time at its own thread count (the time it takes when it has its threads to
    itself) and a ``cap``: the fraction of its threads' time its function may use (a function of M MB on a
    platform whose CPU follows memory gets M / mb_per_vcpu of a core: a quota). A job demands ``threads x
    cap`` cores; while the busy jobs demand D cores (plus ``background``), each runs at ``cap x min(1, cores
    / D)`` of its threads' speed. Uncapped (cap 1) that is egalitarian sharing, ``min(1, cores / (busy
    threads + background))`` of a core each. ``busy_ms`` integrates busy cores over time (for utilisation).
    """

    def __init__(self, kernel: Kernel, cores: float | None, *, background: float = 0.0) -> None:
        self.k = kernel
        self.cores = cores
        self.background = background
        self._jobs: dict[int, list[Any]] = {}  # id -> [remaining work, demand (cores), event, cap]
        self._ids = itertools.count()
        self._last = 0.0
        self._version = 0
        self.busy_core_ms = 0.0

    def _factor(self) -> float:
        """What every job gets of its cap now: 1 unless the busy jobs demand more than the cores."""
        if self.cores is None:
            return 1.0
        demand = sum(j[1] for j in self._jobs.values())
        return min(1.0, self.cores / (demand + self.background)) if demand else 1.0

    def _advance(self) -> None:
        dt = self.k.now - self._last
        if dt > 0 and self._jobs:
            f = self._factor()
            self.busy_core_ms += dt * f * sum(j[1] for j in self._jobs.values())
            for j in self._jobs.values():
                j[0] -= dt * f * j[3]
        self._last = self.k.now

    def _reschedule(self) -> None:
        self._version += 1
        if not self._jobs:
            return
        f = self._factor()
        eta = min(max(0.0, j[0]) / (f * j[3]) for j in self._jobs.values())
        self.k.call_at(self.k.now + eta, self._finish, self._version)

    def _finish(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        done = [jid for jid, j in self._jobs.items() if j[0] <= 1e-9]
        for jid in done:
            self._jobs.pop(jid)[2].succeed()
        self._reschedule()

    def work(self, work_ms: float, threads: int = 1, owner: object = None, cap: float = 1.0) -> Event:
        """An event that succeeds once ``work_ms`` of CPU at ``threads`` threads is done, at most ``cap`` of
        those threads' time (``owner``: unused, as :meth:`TimeSliceCpu.work`)."""
        ev = Event(self.k)
        if work_ms <= 0:
            return ev.succeed()
        cap = min(1.0, max(cap, 1e-6))
        if self.cores is None:
            self.k.call_at(self.k.now + work_ms / cap, ev.succeed, None)
            self.busy_core_ms += work_ms * threads
            return ev
        self._advance()
        self._jobs[next(self._ids)] = [work_ms, max(1, threads) * cap, ev, cap]
        self._reschedule()
        return ev


class _Slice:
    __slots__ = ("done", "left", "owner")

    def __init__(self, left: float, owner: object, done: Callable[[], None]) -> None:
        self.left = left
        self.owner = owner
        self.done = done


class _Core:
    __slots__ = ("budget", "current", "finished_owner", "idle_since", "queue", "version")

    def __init__(self) -> None:
        self.queue: deque[_Slice] = deque()
        self.current: _Slice | None = None
        self.idle_since: float | None = 0.0  # None while it has a thread
        self.budget = 0.0  # what is left of the running thread's time slice
        self.version = 0
        self.finished_owner: object = None  # whose work just ended here (it may go on at once)


class TimeSliceCpu:
    """``cores`` cores, each with its own run queue served in time slices of ``time_slice_ms``, as an
    operating system's scheduler does (not :class:`CpuPool`'s idealised processor sharing).

    Why it matters: under processor sharing every request progresses at the same rate, so the requests of a
    closed loop fall into step and each meets the others' busiest phases (a fork-join's workers all run
    together). Time slices and per-core queues keep them out of step, as on a real machine. A thread that
    wakes goes to an idle core if there is one, else to the core with the fewest threads; a core that runs
    out of work takes a waiting thread from the busiest core. A thread that goes on with more work of the
    same ``owner`` at once (a function's next step, with no wait between) keeps its core and its slice.
    ``background`` always-busy threads slow every core by ``1 + background / cores``. A job of ``threads``
    threads is that many threads of ``work_ms`` each, done when the last is. A core that sat idle for
    ``wake_after_ms`` or more adds ``wake_ms`` of work to the first thread it runs.
    """

    def __init__(self, kernel: Kernel, cores: int, *, time_slice_ms: float, background: float = 0.0,
                 wake_ms: float = 0.0, wake_after_ms: float = math.inf) -> None:
        if cores < 1 or time_slice_ms <= 0:
            raise ValueError(f"TimeSliceCpu needs cores >= 1 and time_slice_ms > 0, got {cores} and {time_slice_ms}")
        self.k = kernel
        self.cores = [_Core() for _ in range(int(cores))]
        self.time_slice_ms = time_slice_ms
        self.speed = 1.0 / (1.0 + max(0.0, background) / len(self.cores))
        self.wake_ms = wake_ms
        self.wake_after_ms = wake_after_ms
        self.busy_core_ms = 0.0

    def work(self, work_ms: float, threads: int = 1, owner: object = None, cap: float = 1.0) -> Event:
        """As :meth:`CpuPool.work`; time slices model whole-core functions only (``cap`` 1)."""
        if cap < 1.0:
            raise ValueError("TimeSliceCpu schedules whole-core functions; a CPU share below one needs CpuPool")
        ev = Event(self.k)
        if work_ms <= 0:
            return ev.succeed()
        n = max(1, threads)
        left = [n]

        def one() -> None:
            left[0] -= 1
            if left[0] == 0:
                ev.succeed()

        for i in range(n):
            self._wake(_Slice(work_ms, owner if i == 0 else None, one))
        return ev

    def _load(self, c: _Core) -> int:
        return len(c.queue) + (c.current is not None)

    def _wake(self, t: _Slice) -> None:
        if t.owner is not None:
            for c in self.cores:
                if c.current is None and c.finished_owner is t.owner:
                    c.finished_owner = None
                    self._run(c, t, c.budget)
                    return
        idle = [c for c in self.cores if c.current is None and not c.queue and c.finished_owner is None]
        if idle:
            self._run(idle[0], t, self.time_slice_ms)
            return
        core = min(self.cores, key=self._load)
        core.queue.append(t)
        if core.current is None and core.finished_owner is None:
            self._dispatch(core)

    def _run(self, c: _Core, t: _Slice, budget: float) -> None:
        if budget <= 1e-9:
            budget = self.time_slice_ms
        if c.idle_since is not None:
            if self.k.now - c.idle_since >= self.wake_after_ms:
                t.left += self.wake_ms
            c.idle_since = None
        c.current = t
        c.budget = budget
        c.version += 1
        ran = min(budget, t.left)
        self.k.call_at(self.k.now + ran / self.speed, self._tick, c, c.version, ran)

    def _tick(self, c: _Core, version: int, ran: float) -> None:
        if version != c.version or c.current is None:
            return
        t = c.current
        c.current = None
        t.left -= ran
        c.budget -= ran
        self.busy_core_ms += ran / self.speed
        if t.left <= 1e-9:
            t.done()
            if t.owner is not None:
                # the thread may go on at once with its next piece of work (it is scheduled just after this)
                c.finished_owner = t.owner
                self.k.call_soon(self._settle, c, c.version)
                return
            self._dispatch(c)
            return
        if c.queue:  # its turn is over: to the back of its core's queue (it does not move to another core)
            c.queue.append(t)
            self._dispatch(c)
        else:
            self._run(c, t, self.time_slice_ms)

    def _settle(self, c: _Core, version: int) -> None:
        """The finished thread did not go on: the core takes its next thread."""
        if c.version == version and c.current is None:
            c.finished_owner = None
            self._dispatch(c)

    def _steal_into(self, c: _Core) -> bool:
        busiest = max(self.cores, key=lambda o: len(o.queue))
        if busiest is c or not busiest.queue:
            return False
        c.queue.append(busiest.queue.pop())
        return True

    def _dispatch(self, c: _Core) -> None:
        if not c.queue and not self._steal_into(c):
            c.idle_since = self.k.now
            return
        self._run(c, c.queue.popleft(), self.time_slice_ms)


@dataclass
class _Instance:
    id: int
    last_used: float
    invocations: int = 0


@dataclass
class FunctionStats:
    invocations: int = 0
    cold_starts: int = 0
    reaped: int = 0
    billed_ms: float = 0.0
    duration_ms: float = 0.0
    waits: int = 0
    max_instances: int = 0


class SimFunction:
    """One function's instances (see the module docstring for the semantics)."""

    def __init__(self, kernel: Kernel, name: str, memory_mb: int, *, threads: int = 1, concurrency: int = 1000,
                 idle_timeout_ms: float = 600_000.0, cold_start_ms: float = 0.0, used_mb: float | None = None,
                 cpu: CpuPool | TimeSliceCpu | None = None, cold_start_cpu_ms: float = 0.0, share: float = 1.0
                 ) -> None:
        self.k = kernel
        self.cpu = cpu
        self.share = share  # the fraction of its threads' time the function may use (its memory's CPU)
        self.cold_start_cpu_ms = cold_start_cpu_ms
        self.name = name
        self.memory_mb = memory_mb
        self.threads = threads
        self.concurrency = concurrency
        self.idle_timeout_ms = idle_timeout_ms
        self.cold_start_ms = cold_start_ms
        self.used_mb = used_mb
        self.idle: list[_Instance] = []
        self.busy = 0
        self.starting = 0
        self.waiters: deque[Event] = deque()
        self.stats = FunctionStats()
        self._ids = itertools.count()

    def _reap(self) -> None:
        now = self.k.now
        keep = [i for i in self.idle if now - i.last_used <= self.idle_timeout_ms]
        self.stats.reaped += len(self.idle) - len(keep)
        self.idle = keep

    @property
    def instances(self) -> int:
        return len(self.idle) + self.busy + self.starting

    def acquire(self) -> Event:
        """An event that succeeds with (instance, was_cold) once an instance is this invocation's."""
        ev = Event(self.k)
        self._reap()
        if self.idle:
            inst = self.idle.pop()  # most recently used first, as the local platform does
            self.busy += 1
            return ev.succeed((inst, False))
        if self.busy + self.starting < self.concurrency:
            self.starting += 1
            self.stats.cold_starts += 1
            self.stats.max_instances = max(self.stats.max_instances, self.instances)

            def started(_: Event) -> None:
                self.starting -= 1
                self.busy += 1
                ev.succeed((_Instance(next(self._ids), self.k.now), True))

            cpu_ms = min(self.cold_start_cpu_ms, self.cold_start_ms) if self.cpu is not None else 0.0
            rest = self.cold_start_ms - cpu_ms
            if cpu_ms > 0:
                assert self.cpu is not None
                # an instance starts inside its CPU share (the local platform starts it in its cgroup)
                self.cpu.work(cpu_ms, 1, None, self.share).on(lambda _: self.k.timeout(rest).on(started))
            else:
                self.k.timeout(rest).on(started)
            return ev
        self.stats.waits += 1
        self.waiters.append(ev)
        return ev

    def release(self, inst: _Instance, duration_ms: float, billed_ms: float) -> None:
        self.stats.invocations += 1
        self.stats.duration_ms += duration_ms
        self.stats.billed_ms += billed_ms
        inst.last_used = self.k.now
        inst.invocations += 1
        if self.waiters:
            self.waiters.popleft().succeed((inst, False))  # handed over: stays busy
            return
        self.busy -= 1
        self.idle.append(inst)


# -- plans -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimWorker:
    """One worker part of a stage: its function and its work (CPU ms at the function's threads)."""

    function: str
    work_ms: float


@dataclass(frozen=True)
class SimStage:
    """A stage: the master's own part (``master_ms``, 0 if none), its put / get+join work, the workers."""

    master_ms: float = 0.0
    put_ms: float = 0.0
    join_ms: float = 0.0
    workers: tuple[SimWorker, ...] = ()


@dataclass(frozen=True)
class SimPlan:
    """A plan as the simulator sees it. ``functions``: name -> (memory MB, threads); the master is
    ``master``. ``used_mb``: memory each function needs (for utilisation), if known. ``request_ms``: the
    master's fixed work per request (receive the input, send the output). ``shares``: per function, the
    fraction of its threads' time its memory buys (missing: 1, whole threads)."""

    name: str
    master: str
    functions: dict[str, tuple[int, int]]
    stages: tuple[SimStage, ...]
    used_mb: dict[str, float] = field(default_factory=dict)
    request_ms: float = 0.0
    shares: dict[str, float] = field(default_factory=dict)

    def scaled(self, factor: float, *, name: str | None = None) -> SimPlan:
        """Every CPU work multiplied by ``factor`` (calibration against a measurement)."""
        stages = tuple(
            SimStage(s.master_ms * factor, s.put_ms * factor, s.join_ms * factor,
                     tuple(SimWorker(w.function, w.work_ms * factor) for w in s.workers))
            for s in self.stages
        )
        return SimPlan(name or self.name, self.master, dict(self.functions), stages, dict(self.used_mb),
                       self.request_ms * factor, dict(self.shares))

    def with_worker_scales(self, factors: Mapping[str, float]) -> SimPlan:
        """Each worker part of function ``f`` with its work multiplied by ``factors[f]`` (default 1)."""
        stages = tuple(
            SimStage(s.master_ms, s.put_ms, s.join_ms,
                     tuple(SimWorker(w.function, w.work_ms * factors.get(w.function, 1.0)) for w in s.workers))
            for s in self.stages
        )
        return SimPlan(self.name, self.master, dict(self.functions), stages, dict(self.used_mb), self.request_ms,
                       dict(self.shares))

    def total_work_ms(self) -> float:
        return self.request_ms + sum(s.master_ms + s.put_ms + s.join_ms + sum(w.work_ms for w in s.workers)
                                     for s in self.stages)


@dataclass(frozen=True)
class SimPlatform:
    """Platform facts the simulation needs. ``cores`` None: dedicated CPU per function (the cloud)."""

    name: str = "local"
    cores: float | None = 2.0
    background: float = 0.0
    invoke: ExGauss = ExGauss(1.0, 0.3, 0.5)  # the invoke round trip's delay (not CPU work)
    client_invoke: ExGauss | None = None  # the client's call to the master (default: ``invoke``)
    granularity_ms: float = 1.0
    price_gb_s: float = 0.0000166667
    price_request: float = 0.0000002
    concurrency: int = 64
    idle_timeout_ms: float = 300_000.0
    cold_start_ms: float = 1000.0
    invoke_cpu_ms: float = 0.0  # CPU work of one invocation's path (codec, HTTP, platform), on the shared cores
    cold_start_cpu_ms: float = 0.0  # of ``cold_start_ms``, the part that is CPU work (process start, imports)
    # CPU work per request beside its critical path (the platform's and the client's threads busy while the
    # functions compute): it takes the shared cores, and so capacity, but the request does not wait for it
    offpath_cpu_ms: float = 0.0
    # the shared cores' scheduler: None, processor sharing (:class:`CpuPool`); else time slices of this
    # length on per-core run queues (:class:`TimeSliceCpu`), as the operating system schedules
    time_slice_ms: float | None = None
    # time slices only: CPU work a core adds to the first thread it runs after sitting idle for
    # ``wake_after_ms`` or more (a core waking from a deep idle state, its caches cold; measured live as the
    # 1-client p50 with pauses over that without)
    wake_ms: float = 0.0
    wake_after_ms: float = math.inf
    # the spread of compute times: each invocation's compute work is its mean times a gamma-distributed
    # factor of mean 1 and this coefficient of variation (0: every invocation takes exactly its work)
    work_cv: float = 0.0

    @property
    def shared_host(self) -> bool:
        """Whether every function shares ``cores`` (the local platform) rather than having CPU of its own."""
        return self.cores is not None

    def billed_ms(self, ms: float) -> float:
        """One invocation's billed duration, as the platform's meter bills it (``platforms.billed_ms``)."""
        return billed_ms(ms, self.granularity_ms)


# -- running a simulation --------------------------------------------------------------------------------


@dataclass
class SimResult:
    latencies_ms: np.ndarray  # per request in arrival order (measured phase only)
    arrivals_ms: np.ndarray
    functions: dict[str, dict[str, Any]]
    duration_ms: float
    cpu_busy_core_ms: float
    cores: float | None
    requests: int

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_ms
        billed_gb_s = sum(f["billed_gb_s"] for f in self.functions.values())
        cost = sum(f["cost_usd"] for f in self.functions.values())
        alloc = sum(f["memory_mb"] / 1024 * f["billed_ms"] / 1000 for f in self.functions.values())
        used = sum(min(f["used_mb"], f["memory_mb"]) / 1024 * f["billed_ms"] / 1000
                   for f in self.functions.values() if f["used_mb"] is not None)
        n = max(1, self.requests)
        out = {
            "requests": self.requests,
            "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
            "p95_ms": float(np.percentile(lat, 95)) if len(lat) else float("nan"),
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
            "mean_ms": float(np.mean(lat)) if len(lat) else float("nan"),
            "throughput_rps": self.requests / (self.duration_ms / 1e3) if self.duration_ms > 0 else float("nan"),
            "cold_starts": sum(f["cold_starts"] for f in self.functions.values()),
            "billed_gb_s": billed_gb_s,
            "usd_per_1000": cost / n * 1000,
            "mc_gb_s_per_request": alloc / n,
            "memory_utilisation": used / alloc if alloc > 0 and any(
                f["used_mb"] is not None for f in self.functions.values()) else float("nan"),
            "max_instances": {k: f["max_instances"] for k, f in self.functions.items()},
            "billed_ms_per_invocation": {k: f["billed_ms"] / f["invocations"]
                                         for k, f in self.functions.items() if f["invocations"]},
            "duration_ms_per_invocation": {k: f["duration_ms"] / f["invocations"]
                                           for k, f in self.functions.items() if f["invocations"]},
        }
        if self.cores:
            out["cpu_utilisation"] = self.cpu_busy_core_ms / (self.cores * self.duration_ms) if self.duration_ms else 0
        return out


def simulate(plan: SimPlan, platform: SimPlatform, *, arrivals_ms: Iterable[float] | None = None,
             clients: int | None = None, requests_per_client: int = 0, warmup: int = 0,
             warmup_clients: int | None = None, seed: int = 0, think_ms: float = 0.0,
             prewarm: bool | Mapping[str, int] = True) -> SimResult:
    """Simulate ``plan`` on ``platform`` under open-loop ``arrivals_ms`` or a closed loop of ``clients``
    x ``requests_per_client`` (each client sends its next request ``think_ms`` after a response).

    ``warmup``: requests per client of a closed-loop warm-up phase (``warmup_clients`` clients, default
    ``clients``) run first and excluded from the figures and the meter, as the live load generator does;
    the measured phase (and open-loop arrival times) start when it ends. ``prewarm``: start with one warm
    instance of every function (a deployment that has been warmed up), or as many as a mapping gives per
    function (missing: none); further instances are cold starts.
    """
    if (arrivals_ms is None) == (clients is None):
        raise ValueError("give either open-loop arrivals_ms or a closed loop's clients")
    k = Kernel()
    rng = np.random.default_rng(seed)
    cpu: CpuPool | TimeSliceCpu
    capped = any(v < 1.0 for v in plan.shares.values())
    if platform.cores is not None and platform.time_slice_ms and not capped:
        cpu = TimeSliceCpu(k, max(1, round(platform.cores)), time_slice_ms=platform.time_slice_ms,
                           background=platform.background, wake_ms=platform.wake_ms,
                           wake_after_ms=platform.wake_after_ms)
    else:
        cpu = CpuPool(k, platform.cores, background=platform.background)
    fns = {
        name: SimFunction(k, name, mem, threads=threads, concurrency=platform.concurrency,
                          idle_timeout_ms=platform.idle_timeout_ms, cold_start_ms=platform.cold_start_ms,
                          used_mb=plan.used_mb.get(name), cpu=cpu, cold_start_cpu_ms=platform.cold_start_cpu_ms,
                          share=plan.shares.get(name, 1.0))
        for name, (mem, threads) in plan.functions.items()
    }
    for name, f in fns.items():
        for _ in range(prewarm.get(name, 0) if isinstance(prewarm, Mapping) else int(bool(prewarm))):
            f.idle.append(_Instance(next(f._ids), 0.0))
    client_inv = platform.client_invoke or platform.invoke
    measured: dict[str, bool] = {"on": False}
    meter = {name: {"invocations": 0, "billed_ms": 0.0, "duration_ms": 0.0, "cold_starts": 0} for name in fns}

    def bill(fn: SimFunction, dur: float, cold: bool) -> None:
        b = platform.billed_ms(dur)
        if measured["on"]:
            m = meter[fn.name]
            m["invocations"] += 1
            m["billed_ms"] += b
            m["duration_ms"] += dur
            m["cold_starts"] += int(cold)
        return None

    quarter = platform.invoke_cpu_ms / 4  # caller side and callee side, on the way there and back
    cv2 = platform.work_cv**2

    def spread() -> float:
        """One invocation's factor on its compute work."""
        return float(rng.gamma(1 / cv2, cv2)) if cv2 > 0 else 1.0

    def worker_call(w: SimWorker) -> Generator[Event, Any, None]:
        fn = fns[w.function]
        yield k.timeout(platform.invoke.draw(rng) / 2)
        yield cpu.work(quarter)
        inst, cold = yield fn.acquire()
        t = k.now
        yield cpu.work(quarter + w.work_ms * spread() + quarter, fn.threads, inst, fn.share)
        dur = k.now - t
        fn.release(inst, dur, platform.billed_ms(dur))
        bill(fn, dur, cold)
        yield cpu.work(quarter)
        yield k.timeout(platform.invoke.draw(rng) / 2)

    def offpath() -> Generator[Event, Any, None]:
        yield cpu.work(platform.offpath_cpu_ms)

    def request() -> Generator[Event, Any, float]:
        t0 = k.now
        master = fns[plan.master]
        if platform.offpath_cpu_ms > 0:
            k.process(offpath())
        yield k.timeout(client_inv.draw(rng) / 2)
        yield cpu.work(quarter)
        inst, cold = yield master.acquire()
        t = k.now
        x = spread()
        cap = master.share
        yield cpu.work(quarter + x * plan.request_ms / 2, master.threads, inst, cap)
        for st in plan.stages:
            if st.workers:
                yield cpu.work(x * st.put_ms, master.threads, inst, cap)
                calls = [k.process(worker_call(w)) for w in st.workers]
                if st.master_ms:
                    yield cpu.work(x * st.master_ms, master.threads, inst, cap)
                yield k.all_of(calls)
                yield cpu.work(x * st.join_ms, master.threads, inst, cap)
            elif st.master_ms:
                yield cpu.work(x * st.master_ms, master.threads, inst, cap)
        yield cpu.work(x * plan.request_ms / 2 + quarter, master.threads, inst, cap)
        dur = k.now - t
        master.release(inst, dur, platform.billed_ms(dur))
        bill(master, dur, cold)
        yield cpu.work(quarter)
        yield k.timeout(client_inv.draw(rng) / 2)
        return k.now - t0

    lat: list[float] = []
    arr: list[float] = []
    t_start = [0.0]
    busy0 = [0.0]

    def warm_client() -> Generator[Event, Any, None]:
        for _ in range(warmup):
            yield k.process(request())

    def measured_client() -> Generator[Event, Any, None]:
        for _ in range(requests_per_client):
            t_arr = k.now
            latency = yield k.process(request())
            lat.append(latency)
            arr.append(t_arr)
            if think_ms:
                yield k.timeout(think_ms)

    def open_request(t_arr: float) -> Generator[Event, Any, None]:
        latency = yield k.process(request())
        lat.append(latency)
        arr.append(t_arr)

    def main() -> Generator[Event, Any, None]:
        if warmup:
            yield k.all_of([k.process(warm_client()) for _ in range(warmup_clients or clients or 1)])
        measured["on"] = True
        t_start[0] = k.now
        busy0[0] = cpu.busy_core_ms
        if arrivals_ms is not None:
            for t in sorted(float(x) for x in arrivals_ms):
                if t_start[0] + t > k.now:
                    yield k.timeout(t_start[0] + t - k.now)
                k.process(open_request(k.now))
        else:
            for _ in range(clients or 0):
                k.process(measured_client())

    k.process(main())
    k.run()
    total = len(lat)
    order = np.argsort(arr, kind="stable")
    lat = [lat[i] for i in order]
    arr = [arr[i] - t_start[0] for i in order]
    end = max((a + b for a, b in zip(arr, lat, strict=True)), default=0.0)
    functions = {}
    for name, f in fns.items():
        m = meter[name]
        gb_s = f.memory_mb / 1024 * m["billed_ms"] / 1000
        functions[name] = {
            "memory_mb": f.memory_mb,
            "used_mb": f.used_mb,
            "invocations": m["invocations"],
            "cold_starts": m["cold_starts"],
            "billed_ms": m["billed_ms"],
            "duration_ms": m["duration_ms"],
            "billed_gb_s": gb_s,
            "cost_usd": gb_s * platform.price_gb_s + m["invocations"] * platform.price_request,
            "max_instances": max(f.stats.max_instances, len(f.idle) + f.busy),
            "waits": f.stats.waits,
            "reaped": f.stats.reaped,
        }
    return SimResult(np.asarray(lat), np.asarray(arr), functions, end, cpu.busy_core_ms - busy0[0],
                     platform.cores, total)
