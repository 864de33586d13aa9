"""The performance model: latency (mean and a percentile), billed cost and memory of a plan.

Its parts live in :mod:`partitioner.perf`, one concept a module: the platform's figures
(:mod:`partitioner.perf.platform`), unit compute times (:mod:`partitioner.perf.compute`), stage choices and
their costs (:mod:`partitioner.perf.options`), the plan estimate (:mod:`partitioner.perf.model`); the
latency distribution is :mod:`partitioner.tail`, the live correction :mod:`partitioner.live`. This module is
the surface the planner, the solvers and the benchmarks import.
"""

from __future__ import annotations

from partitioner.perf.compute import FUNCTION_RUNTIME_MB, ComputeModel, PartOverhead
from partitioner.perf.model import PerfModel, PlanEstimate
from partitioner.perf.options import NO_RELAY, CutCodec, CutCodecs, OptionCost, OptionFloors, Relay, StageChoice
from partitioner.perf.platform import HOST_RESERVE_CORES, PlatformFacts, cpu_stretch
from platforms import ExGauss

__all__ = [
    "FUNCTION_RUNTIME_MB",
    "HOST_RESERVE_CORES",
    "NO_RELAY",
    "ComputeModel",
    "PartOverhead",
    "CutCodec",
    "CutCodecs",
    "ExGauss",
    "OptionCost",
    "OptionFloors",
    "PerfModel",
    "PlanEstimate",
    "PlatformFacts",
    "Relay",
    "StageChoice",
    "cpu_stretch",
]
