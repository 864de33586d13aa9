"""Does a function get the CPU its memory buys? The local platform's share against the profile's.

One fixed piece of one-thread compute (a chain of 512 x 512 MatMuls, ~25 ms on one core) is deployed as a
one-function plan at each memory size and at the reference size that buys one whole vCPU (1769 MB on the
Lambda-like profile); warm requests go to each in turn, round after round, so that the machine's drift
hits every size alike. A size's slow-down is its median duration over the reference's; the profile
expects ``mb_per_vcpu / memory_mb`` (the share is a fraction of one core; one thread can use no more).
The duration is the platform meter's (the instance's own run, as billed), not the client's round trip.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CpuShareResult", "CpuShareRow", "matmul_chain", "measure"]


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


def matmul_chain(out: Path, *, n: int = 512, layers: int = 8) -> Path:
    """``layers`` chained n x n MatMuls with one orthogonal weight (numerically tame), as ``out``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    q, _ = np.linalg.qr(np.random.default_rng(4).standard_normal((n, n)))
    nodes, prev = [], "x"
    for i in range(layers):
        nxt = "y" if i == layers - 1 else f"t{i}"
        nodes.append(helper.make_node("MatMul", [prev, "w"], [nxt]))
        prev = nxt
    g = helper.make_graph(nodes, "matmul_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
                          [numpy_helper.from_array(q.astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(out))
    return out


def measure(memories: Sequence[int] = (256, 512, 1024), *, reference_mb: int | None = None, samples: int = 9,
            layers: int = 8, cpu_limit: str = "auto", profile: str = "local",
            say: Callable[[str], None] = lambda _: None) -> CpuShareResult:
    """Median duration per memory size against the reference size's, on an embedded local platform."""
    from partitioner.export import export_bundle
    from serving.platform.config import PlatformConfig
    from serving.platform.deploy import deploy_bundle
    from serving.platform.master_client import MasterClient
    from serving.platform.server import LocalPlatform

    with tempfile.TemporaryDirectory(prefix="flatpack-cpushare-") as tmp:
        root = Path(tmp)
        bundle = export_bundle(matmul_chain(root / "chain.onnx", layers=layers), "0-:none", root / "bundle")
        config = PlatformConfig(port=0, cpu_limit=cpu_limit, profile=profile, shm_dir=root / "shm")
        with LocalPlatform(config) as p:
            svc = p.service
            ref = reference_mb or int(round(svc.profile.mb_per_vcpu))
            sizes = [ref, *[m for m in memories if m != ref]]
            x = {"x": np.ones((512, 512), np.float32)}
            clients, deployments = {}, {}
            try:
                for mb in sizes:
                    say(f"deploying the probe at {mb} MB (cold start inside its share)")
                    d = deployments[mb] = deploy_bundle(p.client, bundle, memory_mb={"master": mb})
                    clients[mb] = MasterClient(d, p.url, timeout_s=120)
                    clients[mb].infer(x)  # warm
                times: dict[int, list[float]] = {mb: [] for mb in sizes}
                for i in range(samples):
                    say(f"round {i + 1} of {samples}")
                    for mb in sizes:
                        name = deployments[mb].names["master"]
                        before = _meter_ms(p.client.meter(), name)
                        clients[mb].infer(x)
                        # the meter records after the reply; poll for it rather than sleep
                        times[mb].append(_wait_meter(p.client, name, before))
                snapshot = svc.cpu()
            finally:
                for c in clients.values():
                    c.close()
                for d in deployments.values():
                    d.remove()
            ref_ms = statistics.median(times[ref])
            rows = []
            for mb in sizes[1:]:
                share = svc.limiter.share(mb).vcpu
                # one thread uses at most one core, whatever the share above it
                expected = min(1.0, svc.limiter.share(ref).vcpu) / min(1.0, share)
                med = statistics.median(times[mb])
                rows.append(CpuShareRow(mb, share, expected, med / ref_ms, med, med / ref_ms / expected - 1))
            return CpuShareResult(svc.limiter.name, ref, ref_ms, rows, samples,
                                  int(str(snapshot.get("oversubscribed_invocations", 0))),
                                  {"layers": layers, "profile": profile, "period_us": snapshot.get("period_us")})


def _meter_ms(meter: dict[str, Any], name: str) -> tuple[int, float]:
    u = meter.get("functions", {}).get(name, {})
    return int(u.get("invocations", 0)), float(u.get("duration_ms", 0.0))


def _wait_meter(client: Any, name: str, before: tuple[int, float], deadline_s: float = 10.0) -> float:
    end = time.monotonic() + deadline_s
    while True:
        n, total = _meter_ms(client.meter(), name)
        if n > before[0]:
            return (total - before[1]) / (n - before[0])
        if time.monotonic() > end:
            raise RuntimeError(f"the meter did not record the invocation of {name}")
        time.sleep(0.005)
