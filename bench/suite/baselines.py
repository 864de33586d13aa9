"""The papers' baselines, built for the local platform: Unsplit, Uniform slicing, and Pipeline.

* **Unsplit / Default** — the whole model in one function (``"0-:none"``): Gillis's "Default" at a
  fixed memory, MOPAR's "Unsplit" sized to the model's need.
* **Uniform** (MOPAR) — the same number of vertical slices as a MOPAR plan, with equal numbers of units
  per slice; each slice is its own function sized to what it needs (the master only orchestrates).
* **Pipeline** (Gillis) — one function that cannot hold the model: per request it loads each stage's
  part file from storage (a fresh onnxruntime session), runs it, drops it, and goes on, sequentially in
  one process under a memory cap. :class:`PipelineTarget` runs it in a child process of its own (one
  onnxruntime thread, like a 1-vCPU function) and counts a request whose peak resident memory went over
  the cap as an out-of-memory error, as the platform would.
"""

from __future__ import annotations

from functions.plan import Split
from partitioner.perfmodel import PerfModel, StageChoice

__all__ = ["LOAD_FACTOR", "RUNTIME_MB", "pipeline_cap_mb", "pipeline_groups", "resident_mb",
           "uniform_choices", "unsplit_memory_mb"]


# -- plans -----------------------------------------------------------------------------------------------


def unsplit_memory_mb(pm: PerfModel) -> int:
    """The memory the whole model needs in one function, rounded to a size the platform offers."""
    whole = StageChoice(0, len(pm.lg.units) - 1, Split(), True, 0)
    return pm.platform.round_memory(pm.master_need_mb([whole], pm.platform.memory_max_mb))


def uniform_choices(pm: PerfModel, slices: int) -> tuple[list[StageChoice], int]:
    """``slices`` vertical slices with equal numbers of units (the first ones get one more when the
    count does not divide), each on its own worker sized to its need as MOPAR sizes a slice (with the
    footprint's margin where CPU is per function); and the master's memory."""
    from partitioner.solvers.mopar import master_memory_mb, slice_memory_mb

    n = len(pm.lg.units)
    k = max(1, min(slices, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    choices = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        costs = pm.part_costs(a, b - 1, Split())
        assert costs is not None
        mb = slice_memory_mb(pm, pm.compute.memory_mb(costs[0], a, b - 1, costs[0].weight_bytes))
        choices.append(StageChoice(a, b - 1, Split(), False, mb))
    master_mb = master_memory_mb(pm, choices)
    return choices, master_mb


# Resident memory of a process that loads and runs a part with onnxruntime, measured on the local platform:
# about 80 MB of runtime (Python, numpy, onnxruntime and its thread pool) plus about 2.2 x the part's
# weights while the session loads them (the protobuf and the initialised tensors) and runs. The perf
# model's estimate (``ComputeModel.memory_mb``: 60 MB + 1.05 x weights) is below this.
RUNTIME_MB = 80.0
LOAD_FACTOR = 2.2


def resident_mb(pm: PerfModel, first: int, last: int, load_factor: float = LOAD_FACTOR) -> float:
    """What a process running units first..last unsplit holds at its peak (see RUNTIME_MB)."""
    costs = pm.part_costs(first, last, Split())
    assert costs is not None
    c = costs[0]
    return RUNTIME_MB + (load_factor * c.weight_bytes + pm.compute.activation_factor * (
        c.activation_bytes + c.input_bytes)) / 2**20


def pipeline_groups(pm: PerfModel, cap_mb: float, load_factor: float = LOAD_FACTOR) -> list[tuple[int, int]]:
    """Consecutive unit groups, each as large as fits ``cap_mb`` by :func:`resident_mb` (a unit that fits
    nothing alone gets a group of its own)."""
    n = len(pm.lg.units)
    groups: list[tuple[int, int]] = []
    first = 0
    while first < n:
        last = first
        while last + 1 < n and resident_mb(pm, first, last + 1, load_factor) <= cap_mb:
            last += 1
        groups.append((first, last))
        first = last + 1
    return groups


def pipeline_cap_mb(pm: PerfModel, fraction: float = 0.85) -> tuple[int, int]:
    """(cap, whole-model need) for the Pipeline comparison: the cap is ``fraction`` of what the whole model
    needs in one function, but at least what its largest unit needs (Pipeline must be able to run it)."""
    n = len(pm.lg.units)
    need = resident_mb(pm, 0, n - 1)
    largest = max(resident_mb(pm, u, u) for u in range(n))
    cap = pm.platform.round_memory(max(fraction * need, largest))
    return cap, pm.platform.round_memory(need)
