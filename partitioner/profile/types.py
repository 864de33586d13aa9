"""The profiler's values: a measurement, a unit's profile, a model's profile, and the aliases they use."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import onnx

__all__ = ["FORMAT_VERSION", "GraphProfile", "Measurement", "ModelSource", "OptionKey", "ProgressFn", "UnitProfile"]

# Bump when what a measurement means changes (worker protocol, input generation): old entries are ignored.
FORMAT_VERSION = 1

ModelSource: TypeAlias = "onnx.ModelProto | Path | Callable[[], onnx.ModelProto | Path]"
"""A model to measure: a ModelProto, a file, or a zero-argument callable building one (called only
when the measurement is not cached)."""
ProgressFn: TypeAlias = Callable[[int, int, str], None]
"""Called as ``progress(done, total, label)`` after each measurement (cache hits included)."""
OptionKey: TypeAlias = tuple[int, int, str, int]
"""(first unit, last unit, str(split), part index)."""


@dataclass(frozen=True)
class Measurement:
    """One model measured at one thread count in its own process.

    ``median_ms``/``p95_ms``: per-run latency after warm-up. ``peak_rss_mb``: the process's peak
    resident memory (MB = 2**20 bytes) while creating the session and running it. ``cold_start_ms``:
    process spawn to session ready. ``session_ms``: the session-creation part of it.
    """

    median_ms: float
    p95_ms: float
    peak_rss_mb: float
    cold_start_ms: float
    threads: int
    reps: int
    session_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Measurement:
        return cls(
            median_ms=float(d["median_ms"]),
            p95_ms=float(d["p95_ms"]),
            peak_rss_mb=float(d["peak_rss_mb"]),
            cold_start_ms=float(d["cold_start_ms"]),
            threads=int(d["threads"]),
            reps=int(d["reps"]),
            session_ms=float(d.get("session_ms", 0.0)),
        )



@dataclass(frozen=True)
class UnitProfile:
    """Time and memory of one unit's stage model. ``time_ms``/``p95_ms``: thread count -> ms.

    ``measured=False``: predicted (the budget ran out before this unit was measured).
    ``peak_rss_mb`` and ``cold_start_ms`` are those of the largest thread count, measured in a fresh
    process (more threads never need less memory; the difference is a fraction of a MB).
    """

    index: int
    time_ms: dict[int, float]
    p95_ms: dict[int, float]
    peak_rss_mb: float
    cold_start_ms: float
    flops: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    measured: bool
    label: str = ""
    activation_bytes: int = 0

    @classmethod
    def of_unit(cls, index: int, unit: Any, *, time_ms: dict[int, float], p95_ms: dict[int, float],
                peak_rss_mb: float, cold_start_ms: float, measured: bool) -> UnitProfile:
        """The profile of ``unit`` (a ``LayerGraph`` unit: its FLOPs, bytes and label) with these figures."""
        return cls(index=index, time_ms=time_ms, p95_ms=p95_ms, peak_rss_mb=peak_rss_mb, cold_start_ms=cold_start_ms,
                   flops=unit.flops, weight_bytes=unit.weight_bytes, input_bytes=unit.input_bytes,
                   output_bytes=unit.output_bytes, measured=measured, label=unit.label,
                   activation_bytes=unit.activation_bytes)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["time_ms"] = {str(k): v for k, v in self.time_ms.items()}
        d["p95_ms"] = {str(k): v for k, v in self.p95_ms.items()}
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> UnitProfile:
        return cls(
            index=int(d["index"]),
            time_ms={int(k): float(v) for k, v in d["time_ms"].items()},
            p95_ms={int(k): float(v) for k, v in d["p95_ms"].items()},
            peak_rss_mb=float(d["peak_rss_mb"]),
            cold_start_ms=float(d["cold_start_ms"]),
            flops=int(d["flops"]),
            weight_bytes=int(d["weight_bytes"]),
            input_bytes=int(d["input_bytes"]),
            output_bytes=int(d["output_bytes"]),
            measured=bool(d["measured"]),
            label=str(d.get("label", "")),
            activation_bytes=int(d.get("activation_bytes", 0)),
        )


@dataclass(frozen=True)
class GraphProfile:
    """Profiles of every unit of one model on this machine.

    ``base_mb``: :func:`runtime_base_mb`. ``threads``: the thread counts measured; ``skipped_threads``:
    those asked for but above this machine's cores (not measured; extrapolate). ``pair_ms``: by boundary
    ``i``, units ``i`` and ``i + 1`` measured as one stage at the fewest threads measured (median ms; only the
    pairs measured): what a part saves at each boundary it runs through, which the units alone cannot say.
    """

    model: str
    model_sha256: str
    base_mb: float
    threads: tuple[int, ...]
    units: tuple[UnitProfile, ...]
    machine: dict[str, Any]
    created: str
    skipped_threads: tuple[int, ...] = ()
    warmup: int = 3
    reps: int = 10
    measure_s: float = 0.0  # wall time spent measuring for this call (0 when everything was cached)
    pair_ms: dict[int, float] = field(default_factory=dict)

    @property
    def measured_units(self) -> int:
        return sum(u.measured for u in self.units)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "model": self.model,
            "model_sha256": self.model_sha256,
            "base_mb": self.base_mb,
            "threads": list(self.threads),
            "skipped_threads": list(self.skipped_threads),
            "warmup": self.warmup,
            "reps": self.reps,
            "measure_s": self.measure_s,
            "machine": dict(self.machine),
            "created": self.created,
            "units": [u.to_json() for u in self.units],
            "pair_ms": {str(k): v for k, v in sorted(self.pair_ms.items())},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GraphProfile:
        fmt = int(d.get("format", FORMAT_VERSION))
        if fmt > FORMAT_VERSION:
            raise ValueError(f"profile format {fmt} is newer than this flatpack's ({FORMAT_VERSION}); upgrade flatpack")
        return cls(
            model=str(d["model"]),
            model_sha256=str(d["model_sha256"]),
            base_mb=float(d["base_mb"]),
            threads=tuple(int(t) for t in d["threads"]),
            units=tuple(UnitProfile.from_json(u) for u in d["units"]),
            machine=dict(d.get("machine", {})),
            created=str(d.get("created", "")),
            skipped_threads=tuple(int(t) for t in d.get("skipped_threads", ())),
            warmup=int(d.get("warmup", 3)),
            reps=int(d.get("reps", 10)),
            measure_s=float(d.get("measure_s", 0.0)),
            pair_ms={int(k): float(v) for k, v in (d.get("pair_ms") or {}).items()},
        )

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> GraphProfile:
        with open(path) as f:
            return cls.from_json(json.load(f))

