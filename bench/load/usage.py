"""What a run cost, from the platform's billing meter: GB-s, USD, cold starts, memory utilisation, MC.

The meter's counters are cumulative per function, so a run's usage is the difference of two snapshots
taken around it (:func:`serving.platform.meter.meter_delta`). Memory *used* is each function's peak
resident memory as the platform measured it (``max_rss_mb``, the high-water mark of its instances);
memory *allocated* is its configured size. Following MOPAR:

* memory utilisation = sum_f used_f x billed_s_f / sum_f allocated_f x billed_s_f (time-weighted, so a
  function that runs longer counts more);
* MC (memory consumption) = allocated memory x time = sum_f allocated_GB_f x billed_s_f, i.e. the billed
  GB-seconds; reported per request too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from serving.platform.meter import meter_delta

__all__ = ["UsageSummary", "add_deltas", "meter_delta", "usage_summary"]


@dataclass(frozen=True)
class UsageSummary:
    """Totals of a meter delta (see the module docstring); ``functions``: the delta's rows by function."""

    invocations: int
    function_errors: int
    cold_starts: int
    billed_gb_s: float
    cost_usd: float
    usd_per_1000: float
    allocated_mb: int
    used_mb: float
    memory_utilisation: float
    mc_gb_s: float
    mc_gb_s_per_request: float
    used_gb_s_per_request: float
    functions: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["functions"] = {k: dict(v) for k, v in self.functions.items()}
        return out


def add_deltas(deltas: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Meter deltas of consecutive stretches (:func:`meter_delta`, one per stretch) as one: the counters and
    errors by type summed, each function's memory as of the last stretch it ran in and its highest peak
    resident memory."""
    out: dict[str, dict[str, Any]] = {}
    for delta in deltas:
        for name, row in delta.items():
            acc = out.get(name)
            if acc is None:
                out[name] = {**row, "errors_by_type": dict(row.get("errors_by_type") or {})}
                continue
            for k, v in row.items():
                if k == "errors_by_type":
                    for kind, n in (v or {}).items():
                        acc[k][kind] = acc[k].get(kind, 0) + n
                elif k == "max_rss_mb":
                    acc[k] = max(acc[k], v)
                elif k == "memory_mb":
                    acc[k] = v
                else:
                    acc[k] = acc.get(k, 0) + v
    return out


def usage_summary(delta: Mapping[str, Mapping[str, Any]], requests: int) -> UsageSummary:
    """Totals of a meter delta: billed GB-s, USD (and per 1000 requests), cold starts, memory utilisation, MC."""
    billed = sum(float(r["billed_gb_s"]) for r in delta.values())
    cost = sum(float(r["cost_usd"]) for r in delta.values())
    alloc_s = sum(r["memory_mb"] / 1024 * r["billed_ms"] / 1000 for r in delta.values())
    used_s = sum(min(r["max_rss_mb"], r["memory_mb"]) / 1024 * r["billed_ms"] / 1000 for r in delta.values())
    return UsageSummary(
        invocations=sum(int(r["invocations"]) for r in delta.values()),
        function_errors=sum(int(r["errors"]) for r in delta.values()),
        cold_starts=sum(int(r["cold_starts"]) for r in delta.values()),
        billed_gb_s=billed,
        cost_usd=cost,
        usd_per_1000=cost / requests * 1000 if requests else float("nan"),
        allocated_mb=sum(int(r["memory_mb"]) for r in delta.values() if r["invocations"]),
        used_mb=sum(float(r["max_rss_mb"]) for r in delta.values() if r["invocations"]),
        memory_utilisation=used_s / alloc_s if alloc_s > 0 else float("nan"),
        mc_gb_s=alloc_s,
        mc_gb_s_per_request=alloc_s / requests if requests else float("nan"),
        used_gb_s_per_request=used_s / requests if requests else float("nan"),
        functions={k: dict(v) for k, v in delta.items()},
    )
