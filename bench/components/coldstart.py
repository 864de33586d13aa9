"""What a cold start costs the host, and the warm requests beside it: instances forked by the zygote against
instances started as new interpreters (:mod:`serving.platform.zygote`).

Two embedded local platforms run in this process, one with the zygote and one without, with the same CPU
limit. On each, the probe (``flatpack calibrate``'s fixed computation, :func:`serving.calibrate.probes.compute_model`)
is deployed twice: a *serve* function kept warm, and a *start* function whose instances are started
``starts`` at a time (provisioned concurrency, as a pool that replaces killed instances starts them). Rounds
alternate between the two platforms, so the machine's drift hits both alike. Each round, on each:

* **starts alone**: ``starts`` instances started at once, nothing else running. Per start: its wall time
  (the platform's ``init_ms``), its own CPU time when it was ready (its threads' schedstat; a forked one's
  counts from the fork) plus its share of the zygote's CPU over the batch, and the host's busy CPU time
  (``/proc/stat``) over the batch divided by the starts (:mod:`bench.sim.live`'s readers);
* **quiet**: ``requests`` warm requests to the serve function, one after another;
* **beside starts**: warm requests to the serve function while another ``starts`` instances start.

The figures: the median start's wall and CPU time per arm, their ratio, and each arm's warm p50 / p95 beside
starts over its quiet p50 (the slow-down a start inflicts on a request that has nothing to do with it).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ColdStartArm", "ColdStartResult", "measure"]

@dataclass(frozen=True)
class ColdStartArm:
    arm: str  # "zygote" or "exec"
    starts: int
    start_ms: float  # median wall time of a start (the platform's init_ms)
    start_cpu_s: float  # median CPU time of a start (its own, plus its share of the zygote's)
    host_cpu_s: float  # the host's busy CPU time per start, starts alone
    quiet_p50_ms: float
    beside_p50_ms: float
    beside_p95_ms: float
    beside_p50_ratio: float  # beside starts over quiet, p50
    beside_p95_ratio: float  # beside starts (p95) over quiet (p50)


@dataclass(frozen=True)
class ColdStartResult:
    cpu_limit: str
    memory_mb: int
    rounds: int
    arms: list[ColdStartArm]
    config: dict[str, Any] = field(default_factory=dict)

    def arm(self, name: str) -> ColdStartArm:
        return next(a for a in self.arms if a.arm == name)

    def to_json(self) -> dict[str, Any]:
        z, e = self.arm("zygote"), self.arm("exec")
        return {"cpu_limit": self.cpu_limit, "memory_mb": self.memory_mb, "rounds": self.rounds,
                "rows": [{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(a).items()}
                         for a in self.arms],
                "start_cpu_ratio": round(z.start_cpu_s / e.start_cpu_s, 4),
                "host_cpu_ratio": round(z.host_cpu_s / e.host_cpu_s, 4),
                "start_ms_ratio": round(z.start_ms / e.start_ms, 4),
                "beside_p95_ratio_zygote_over_exec": round(z.beside_p95_ms / e.beside_p95_ms, 4),
                "config": self.config}


class _Arm:
    """One platform of the comparison, with its serve and start functions."""

    def __init__(self, name: str, platform: Any, bundle: Path, x: Any) -> None:
        from serving.platform.deploy import deploy_bundle
        from serving.platform.master_client import MasterClient

        self.name = name
        self.p = platform
        self.serve = deploy_bundle(platform.client, bundle, transport="shm")
        self.start = deploy_bundle(platform.client, bundle, transport="shm", concurrency=1000)
        self.caller = MasterClient(self.serve, platform.url, timeout_s=120)
        self.x = x
        self.caller.infer(x)  # warm
        self.have = 0
        self.start_ms: list[float] = []
        self.start_cpu: list[float] = []
        self.host_cpu: list[float] = []
        self.quiet: list[float] = []
        self.beside: list[float] = []

    @property
    def _start_fn(self) -> str:
        return str(self.start.master)

    def _zygote_pid(self) -> int | None:
        z = self.p.service.zygote
        return None if z is None else z.pid

    def _start(self, k: int) -> list[dict[str, Any]]:
        """Start ``k`` more instances of the start function at once; the new ones' descriptions."""
        before = {i["id"] for i in self.p.client.function(self._start_fn)["instances"]}
        self.have += k
        svc = self.p.service
        asyncio.run_coroutine_threadsafe(svc.prewarm(self._start_fn, self.have), svc.loop).result(600)
        return [i for i in self.p.client.function(self._start_fn)["instances"] if i["id"] not in before]

    def starts_alone(self, k: int) -> None:
        from bench.sim.live import machine_busy_ms, process_cpu_ms

        def cpu_s(pid: int | None) -> float:
            return (process_cpu_ms(pid) or 0.0) / 1e3 if pid else 0.0

        zpid = self._zygote_pid()
        z0, h0 = cpu_s(zpid), machine_busy_ms()
        new = self._start(k)
        host = (machine_busy_ms() - h0) / 1e3
        zpid = zpid or self._zygote_pid()  # started by this batch: all its CPU is the batch's
        zygote_share = (cpu_s(zpid) - z0) / max(1, len(new))
        for inst in new:
            self.start_ms.append(float(inst["init_ms"]))
            self.start_cpu.append(cpu_s(int(inst["pid"])) + zygote_share)
        self.host_cpu.append(host / max(1, len(new)))

    def requests(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            self.caller.infer(self.x)
            out.append(1e3 * (time.perf_counter() - t))
        return out

    def beside_starts(self, k: int) -> None:
        done = threading.Event()
        errors: list[BaseException] = []

        def starter() -> None:
            try:
                self._start(k)
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread below
                errors.append(e)
            finally:
                done.set()

        th = threading.Thread(target=starter)
        th.start()
        while not done.is_set():
            self.beside.extend(self.requests(1))
        th.join()
        if errors:
            raise errors[0]

    def result(self) -> ColdStartArm:
        q = statistics.median(self.quiet)
        b50 = statistics.median(self.beside)
        b95 = statistics.quantiles(self.beside, n=20)[-1] if len(self.beside) >= 2 else b50
        return ColdStartArm(self.name, len(self.start_ms), statistics.median(self.start_ms),
                            statistics.median(self.start_cpu), statistics.median(self.host_cpu), q, b50, b95,
                            b50 / q, b95 / q)

    def close(self) -> None:
        self.caller.close()
        for d in (self.serve, self.start):
            d.remove(purge=True)


def measure(*, rounds: int = 6, starts: int = 8, requests: int = 20, memory_mb: int = 512, size: int = 512,
            layers: int = 8, cpu_limit: str = "auto", say: Callable[[str], None] = lambda _: None) -> ColdStartResult:
    """The comparison (see the module docstring) on two embedded local platforms."""
    import numpy as np

    from serving.calibrate.probes import compute_model, write_probe_bundle
    from serving.platform.config import PlatformConfig
    from serving.platform.server import LocalPlatform

    if rounds < 1 or starts < 1 or requests < 2:
        raise ValueError(f"need rounds >= 1, starts >= 1 and requests >= 2, got {rounds}, {starts}, {requests}")
    x = {"x": np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)}
    with tempfile.TemporaryDirectory(prefix="flatpack-coldstart-") as tmp:
        root = Path(tmp)
        bundle = write_probe_bundle(root / "probe", compute_model(size, layers), memory_mb=memory_mb)
        configs = {arm: PlatformConfig(port=0, cpu_limit=cpu_limit, shm_dir=root / f"shm-{arm}",
                                       zygote=arm == "zygote", idle_timeout_s=3600)
                   for arm in ("zygote", "exec")}
        with LocalPlatform(configs["zygote"]) as pz, LocalPlatform(configs["exec"]) as pe:
            arms = [_Arm("zygote", pz, bundle, x), _Arm("exec", pe, bundle, x)]
            try:
                for r in range(rounds):
                    for arm in arms if r % 2 == 0 else arms[::-1]:
                        say(f"round {r + 1} of {rounds}, {arm.name}: {starts} starts alone")
                        arm.starts_alone(starts)
                        say(f"round {r + 1} of {rounds}, {arm.name}: {requests} quiet requests")
                        arm.quiet.extend(arm.requests(requests))
                        say(f"round {r + 1} of {rounds}, {arm.name}: requests beside {starts} starts")
                        arm.beside_starts(starts)
                results = [a.result() for a in arms]
            finally:
                for a in arms:
                    a.close()
            limit = pz.service.limiter.name
    return ColdStartResult(limit, memory_mb, rounds, results,
                           {"starts_per_batch": starts, "requests": requests, "probe": f"{layers} x {size}^2 MatMul"})
