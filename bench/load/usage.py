"""What a run cost, from the platform's billing meter: GB-s, USD, cold starts, memory utilisation, MC.

The meter's counters are cumulative per function, so a run's usage is the difference of two snapshots
taken around it (:func:`meter_delta`). Memory *used* is each function's peak resident memory as the
platform measured it (``max_rss_mb``, the high-water mark of its instances); memory *allocated* is its
configured size. Following MOPAR:

* memory utilisation = sum_f used_f x billed_s_f / sum_f allocated_f x billed_s_f (time-weighted, so a
  function that runs longer counts more);
* MC (memory consumption) = allocated memory x time = sum_f allocated_GB_f x billed_s_f, i.e. the billed
  GB-seconds; reported per request too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["UsageSummary", "meter_delta", "usage_summary"]

_COUNTERS = ("invocations", "errors", "cold_starts", "duration_ms", "billed_ms", "billed_gb_s", "init_ms", "cost_usd")


def meter_delta(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
                ) -> dict[str, dict[str, Any]]:
    """Per-function usage between two meter snapshots (``{function: usage}`` as the meter reports)."""
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
