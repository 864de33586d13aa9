"""Does a function get the CPU its memory buys? The local platform's share against the profile's.

An embedded local platform is measured by ``flatpack calibrate``'s own CPU-share probe
(:func:`serving.calibrate.measure.measure_cpu_share`). A fixed one-thread computation (512 x 512 MatMuls,
about 25 ms on one core) is deployed at each memory size and at the reference size, which buys one whole
vCPU (1769 MB on the Lambda-like profile). Warm requests go to each in turn, round after round, so that the
machine's drift hits every size alike. A size's slow-down is its trimmed mean metered duration (the
instance's own run, as billed; the slowest and fastest tenth left out) over the reference's. The profile
expects ``mb_per_vcpu / memory_mb``: the share is a fraction of one core, and one thread can use no more.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CpuShareResult", "CpuShareRow", "TogetherRow", "measure"]


@dataclass(frozen=True)
class CpuShareRow:
    memory_mb: int
    vcpu: float
    expected_slowdown: float
    measured_slowdown: float
    median_ms: float
    error: float  # measured / expected - 1


@dataclass(frozen=True)
class TogetherRow:
    """``instances`` copies of the probe at ``memory_mb``, each its own function, sent a request at once: the
    median of the slowest one's time over the median of one run alone (in the same rounds), and whether
    their shares fit this machine's cores less the host's reserve (``partitioner.perfmodel.HOST_RESERVE_CORES``)."""

    instances: int
    memory_mb: int
    demand_vcpu: float
    fits: bool
    alone_ms: float
    slowest_ms: float
    slowdown: float


@dataclass(frozen=True)
class CpuShareResult:
    cpu_limit: str
    reference_mb: int
    reference_ms: float
    rows: list[CpuShareRow]
    samples: int
    oversubscribed_invocations: int
    config: dict[str, Any] = field(default_factory=dict)
    together: list[TogetherRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"cpu_limit": self.cpu_limit, "reference_mb": self.reference_mb,
                "reference_ms": round(self.reference_ms, 3), "samples": self.samples,
                "oversubscribed_invocations": self.oversubscribed_invocations,
                "rows": [{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()}
                         for r in self.rows],
                "together": [{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()}
                             for r in self.together],
                "config": self.config}


def measure(memories: Sequence[int] = (256, 512, 1024), *, reference_mb: int | None = None, samples: int = 9,
            layers: int = 8, cpu_limit: str = "auto", profile: str = "local",
            together_counts: Sequence[int] = (), together_mb: int = 512,
            say: Callable[[str], None] = lambda _: None) -> CpuShareResult:
    """Trimmed mean duration per memory size against the reference size's, on an embedded local platform; and,
    for each of ``together_counts``, that many instances at ``together_mb`` computing at once
    (:class:`TogetherRow`): where their shares stop fitting this machine's cores."""
    from serving.calibrate.measure import CalibrationSettings, measure_cpu_share
    from serving.platform.config import PlatformConfig
    from serving.platform.server import LocalPlatform

    settings = CalibrationSettings(cpu_samples=samples, cpu_share_mb=tuple(memories), compute_n=512,
                                   compute_layers=layers)
    with tempfile.TemporaryDirectory(prefix="flatpack-cpushare-") as tmp:
        root = Path(tmp)
        config = PlatformConfig(port=0, cpu_limit=cpu_limit, profile=profile, shm_dir=root / "shm")
        with LocalPlatform(config) as p:
            svc = p.service
            mem = svc.profile.memory
            shares = measure_cpu_share(p.client, p.url, settings, root, mb_per_vcpu=svc.profile.mb_per_vcpu,
                                       memory_range=(mem.min_mb, mem.max_mb), reference_mb=reference_mb,
                                       progress=lambda what, done, total: say(f"{what}: {done} of {total}"))
            together = [_together(p, root / f"together-{k}", k, together_mb, layers, samples, say)
                        for k in together_counts] if together_counts else []
            snapshot = svc.cpu()
            rows = [CpuShareRow(s.memory_mb, svc.limiter.share(s.memory_mb).vcpu, s.expected_slowdown,
                                s.measured_slowdown, s.ms, s.measured_slowdown / s.expected_slowdown - 1)
                    for s in shares]
    if not shares:
        raise ValueError(f"no memory size to compare: {list(memories)} are all the reference size or outside "
                         f"the profile's {mem.min_mb}-{mem.max_mb} MB")
    return CpuShareResult(svc.limiter.name, shares[0].reference_mb, shares[0].reference_ms, rows, samples,
                          int(str(snapshot.get("oversubscribed_invocations", 0))),
                          {"layers": layers, "profile": profile, "period_us": snapshot.get("period_us")}, together)


def _together(p: Any, root: Path, k: int, memory_mb: int, layers: int, samples: int,
              say: Callable[[str], None]) -> TogetherRow:
    """One :class:`TogetherRow`: ``k`` functions of the probe at ``memory_mb`` on the platform ``p``; each round
    one request to the first alone, then one to each at once (threads)."""
    import statistics
    import threading

    import numpy as np

    from partitioner.perfmodel import HOST_RESERVE_CORES
    from serving.calibrate.probes import compute_model, write_probe_bundle
    from serving.platform.deploy import deploy_bundle
    from serving.platform.master_client import MasterClient

    bundle = write_probe_bundle(root, compute_model(512, layers), memory_mb=memory_mb)
    deps = [deploy_bundle(p.client, bundle, transport="shm") for _ in range(k)]
    callers = [MasterClient(d, p.url, timeout_s=120) for d in deps]
    x = {"x": np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)}
    alone: list[float] = []
    slowest: list[float] = []
    try:
        for c in callers:  # every instance started and warm
            c.infer(x)
        for i in range(samples):
            say(f"{k} instances at {memory_mb} MB at once: round {i + 1} of {samples}")
            t = time.perf_counter()
            callers[0].infer(x)
            alone.append((time.perf_counter() - t) * 1e3)
            took = [0.0] * k
            errors: list[BaseException] = []

            def run(j: int, took: list[float] = took, errors: list[BaseException] = errors) -> None:
                try:
                    t0 = time.perf_counter()
                    callers[j].infer(x)
                    took[j] = (time.perf_counter() - t0) * 1e3
                except Exception as e:  # noqa: BLE001 - counted and re-raised below, not swallowed
                    errors.append(e)

            threads = [threading.Thread(target=run, args=(j,)) for j in range(k)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            if errors:
                raise RuntimeError(f"{len(errors)} of {k} requests at once failed: {errors[0]}") from errors[0]
            slowest.append(max(took))
    finally:
        for c in callers:
            c.close()
        for d in deps:
            d.remove(purge=True)
    share = p.service.limiter.share(memory_mb).vcpu
    room = p.service.limiter.cores - HOST_RESERVE_CORES
    a, s = statistics.median(alone), statistics.median(slowest)
    return TogetherRow(k, memory_mb, k * share, k * share <= room + 1e-9, a, s, s / a)
