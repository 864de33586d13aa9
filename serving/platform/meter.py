"""The billing meter: per function invocations, billed GB-seconds (and vCPU-seconds), cold starts, errors.

Billed duration is the invocation's duration rounded up to the profile's granularity, times the
function's memory in GB (Lambda's rule). Where the profile sells CPU per function (``cpu: {model:
per_function}``), the CPU each function holds is metered too, as billed vCPU-seconds (its vCPU times the
billed duration), and priced at the profile's ``cpu.price_per_vcpu_s`` (0 where CPU is not priced apart:
resources held x time, with only memory priced). Instance start-up (process start, imports, loading the parts)
is counted separately as ``init_ms`` and not billed, as Lambda did for on-demand functions until 2025.
Readable as JSON (:meth:`Meter.snapshot`) and as Prometheus text (:meth:`Meter.prometheus_text`).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from platforms import PlatformProfile

__all__ = ["FunctionUsage", "Meter", "UsageJSON", "meter_delta"]


class UsageJSON(TypedDict):
    """One function's usage as :meth:`Meter.snapshot` reports it."""

    memory_mb: int
    invocations: int
    errors: int
    errors_by_type: dict[str, int]
    cold_starts: int
    duration_ms: float
    billed_ms: float
    billed_gb_s: float
    vcpu: float | None
    billed_vcpu_s: float
    init_ms: float
    max_rss_mb: float
    cost_usd: float


_Totalled = Literal["invocations", "errors", "cold_starts", "billed_ms", "billed_gb_s", "billed_vcpu_s", "cost_usd"]
_TOTALLED: tuple[_Totalled, ...] = get_args(_Totalled)


#: the counters a usage accumulates, which a delta of two snapshots subtracts
_COUNTERS = ("invocations", "errors", "cold_starts", "duration_ms", "billed_ms", "billed_gb_s", "init_ms", "cost_usd")


def meter_delta(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
                ) -> dict[str, dict[str, Any]]:
    """Per-function usage between two meter snapshots (``{function: usage}`` as :meth:`Meter.snapshot`
    reports it, or as its JSON): the counters' differences (errors by type too), each function's memory
    and peak resident memory as of ``after``. The meter's counters are cumulative, so what a run used is
    the difference of the snapshots taken around it."""
    out: dict[str, dict[str, Any]] = {}
    for name, a in after.items():
        b = before.get(name, {})
        row: dict[str, Any] = {k: float(a.get(k, 0) or 0) - float(b.get(k, 0) or 0) for k in _COUNTERS}
        row["invocations"] = int(row["invocations"])
        row["errors"] = int(row["errors"])
        row["cold_starts"] = int(row["cold_starts"])
        kinds = {k: int(n) - int((b.get("errors_by_type") or {}).get(k, 0))
                 for k, n in (a.get("errors_by_type") or {}).items()}
        row["errors_by_type"] = {k: n for k, n in kinds.items() if n}
        row["memory_mb"] = int(a.get("memory_mb", 0) or 0)
        row["max_rss_mb"] = float(a.get("max_rss_mb", 0) or 0)
        out[name] = row
    return out


@dataclass
class FunctionUsage:
    memory_mb: int = 0
    invocations: int = 0
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    cold_starts: int = 0
    duration_ms: float = 0.0
    billed_ms: float = 0.0
    billed_gb_s: float = 0.0
    vcpu: float | None = None  # the function's own CPU on a per_function platform
    billed_vcpu_s: float = 0.0
    init_ms: float = 0.0
    max_rss_mb: float = 0.0

    def to_json(self, profile: PlatformProfile) -> UsageJSON:
        return {
            "memory_mb": self.memory_mb,
            "invocations": self.invocations,
            "errors": sum(self.errors.values()),
            "errors_by_type": dict(self.errors),
            "cold_starts": self.cold_starts,
            "duration_ms": round(self.duration_ms, 3),
            "billed_ms": round(self.billed_ms, 3),
            "billed_gb_s": self.billed_gb_s,
            "vcpu": self.vcpu,
            "billed_vcpu_s": self.billed_vcpu_s,
            "init_ms": round(self.init_ms, 1),
            "max_rss_mb": round(self.max_rss_mb, 1),
            "cost_usd": self.billed_gb_s * profile.price_per_gb_s + self.invocations * profile.price_per_request
            + self.billed_vcpu_s * profile.cpu.price_per_vcpu_s,
        }


class Meter:
    """Thread-safe usage per function, plus the same numbers as Prometheus metrics."""

    def __init__(self, profile: PlatformProfile) -> None:
        self.profile = profile
        self._usage: dict[str, FunctionUsage] = {}
        self._lock = threading.Lock()
        self.registry = CollectorRegistry()
        self._invocations = Counter("flatpack_invocations", "Invocations", ["function"], registry=self.registry)
        self._errors = Counter("flatpack_errors", "Failed invocations", ["function", "type"], registry=self.registry)
        self._cold = Counter("flatpack_cold_starts", "Instances started", ["function"], registry=self.registry)
        self._billed = Counter("flatpack_billed_gb_seconds", "Billed GB-seconds", ["function"], registry=self.registry)
        self._billed_vcpu = Counter("flatpack_billed_vcpu_seconds", "Billed vCPU-seconds (per_function CPU)",
                                    ["function"], registry=self.registry)
        self._billed_ms = Counter("flatpack_billed_milliseconds", "Billed duration", ["function"],
                                  registry=self.registry)
        self._duration = Histogram(
            "flatpack_duration_seconds", "Invocation duration", ["function"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )

    def _get(self, function: str, memory_mb: int) -> FunctionUsage:
        u = self._usage.get(function)
        if u is None:
            u = self._usage[function] = FunctionUsage(memory_mb=memory_mb)
        u.memory_mb = memory_mb
        return u

    def cold_start(self, function: str, memory_mb: int, init_ms: float) -> None:
        with self._lock:
            u = self._get(function, memory_mb)
            u.cold_starts += 1
            u.init_ms += init_ms
        self._cold.labels(function).inc()

    def record(self, function: str, memory_mb: int, duration_ms: float | None, *, error: str | None = None,
               peak_rss_mb: float = 0.0, vcpu: float | None = None) -> None:
        """One invocation; ``duration_ms`` None when it never ran (e.g. its instance failed to start).
        ``vcpu``: the CPU the function holds where it is its own setting (a per_function platform), metered
        as vCPU-seconds; None where CPU follows memory (its GB-s say it all)."""
        billed_ms = self.profile.billed_ms(duration_ms) if duration_ms is not None else 0.0
        gb_s = memory_mb / 1024 * billed_ms / 1000
        vcpu_s = vcpu * billed_ms / 1000 if vcpu is not None else 0.0
        with self._lock:
            u = self._get(function, memory_mb)
            u.invocations += 1
            if vcpu is not None:
                u.vcpu = vcpu
            if duration_ms is not None:
                u.duration_ms += duration_ms
                u.billed_ms += billed_ms
                u.billed_gb_s += gb_s
                u.billed_vcpu_s += vcpu_s
            if error is not None:
                u.errors[error] += 1
            u.max_rss_mb = max(u.max_rss_mb, peak_rss_mb)
        self._invocations.labels(function).inc()
        if duration_ms is not None:
            self._billed.labels(function).inc(gb_s)
            self._billed_ms.labels(function).inc(billed_ms)
            if vcpu is not None:
                self._billed_vcpu.labels(function).inc(vcpu_s)
            self._duration.labels(function).observe(duration_ms / 1000)
        if error is not None:
            self._errors.labels(function, error).inc()

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            functions = {name: u.to_json(self.profile) for name, u in sorted(self._usage.items())}
        total: dict[str, float] = defaultdict(float)
        for f in functions.values():
            for k in _TOTALLED:
                total[k] += f[k]
        return {"profile": self.profile.name, "functions": functions, "total": dict(total)}

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)
