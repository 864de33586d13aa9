"""Does a function get the CPU its memory buys? The local platform's share against the profile's.

An embedded local platform is measured by ``flatpack calibrate``'s own CPU-share probe
(:func:`serving.calibrate.measure.measure_cpu_share`). A fixed one-thread computation (512 x 512 MatMuls,
about 25 ms on one core) is deployed at each memory size and at the reference size, which buys one whole
vCPU (1769 MB on the Lambda-like profile). Warm requests go to each in turn, round after round, so that the
machine's drift hits every size alike. A size's slow-down is its median metered duration (the instance's
own run, as billed) over the reference's. The profile expects ``mb_per_vcpu / memory_mb``: the share is a
fraction of one core, and one thread can use no more.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CpuShareResult", "CpuShareRow", "measure"]


@dataclass(frozen=True)
class CpuShareRow:
    memory_mb: int
    vcpu: float
    expected_slowdown: float
    measured_slowdown: float
    median_ms: float
    error: float  # measured / expected - 1


@dataclass(frozen=True)
class CpuShareResult:
    cpu_limit: str
    reference_mb: int
    reference_ms: float
    rows: list[CpuShareRow]
    samples: int
    oversubscribed_invocations: int
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"cpu_limit": self.cpu_limit, "reference_mb": self.reference_mb,
                "reference_ms": round(self.reference_ms, 3), "samples": self.samples,
                "oversubscribed_invocations": self.oversubscribed_invocations,
                "rows": [{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()}
                         for r in self.rows],
                "config": self.config}


def measure(memories: Sequence[int] = (256, 512, 1024), *, reference_mb: int | None = None, samples: int = 9,
            layers: int = 8, cpu_limit: str = "auto", profile: str = "local",
            say: Callable[[str], None] = lambda _: None) -> CpuShareResult:
    """Median duration per memory size against the reference size's, on an embedded local platform."""
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
            snapshot = svc.cpu()
            rows = [CpuShareRow(s.memory_mb, svc.limiter.share(s.memory_mb).vcpu, s.expected_slowdown,
                                s.measured_slowdown, s.ms, s.measured_slowdown / s.expected_slowdown - 1)
                    for s in shares]
    if not shares:
        raise ValueError(f"no memory size to compare: {list(memories)} are all the reference size or outside "
                         f"the profile's {mem.min_mb}-{mem.max_mb} MB")
    return CpuShareResult(svc.limiter.name, shares[0].reference_mb, shares[0].reference_ms, rows, samples,
                          int(str(snapshot.get("oversubscribed_invocations", 0))),
                          {"layers": layers, "profile": profile, "period_us": snapshot.get("period_us")})
