"""The planners: a search space of stage choices (:mod:`~partitioner.solvers.common`) in, a plan out.

- ``lo`` mode: :func:`latency_dp`, Gillis's dynamic program (:mod:`~partitioner.solvers.dp`);
- ``slo`` mode: :func:`slo_dp` (exact), :func:`rl_solver` (Gillis's reinforcement learning,
  stable-baselines3), :func:`bo_solver` (Bayesian optimisation, optuna), and
  :mod:`~partitioner.solvers.bruteforce` for small models;
- ``mopar`` mode: :func:`hypad` (:mod:`~partitioner.solvers.mopar`), over the layer graph coarsened by
  :mod:`~partitioner.solvers.coarsen`.

``__all__`` is the surface the planner and the benchmarks use; each name is imported from its module on
first use (PEP 562), so that ``rl_solver`` alone needs stable-baselines3 and ``bo_solver`` alone optuna.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from partitioner.solvers.bo import bo_solver
    from partitioner.solvers.common import SPLITS, Infeasible, SearchSpace, SolverResult
    from partitioner.solvers.dp import latency_dp, slo_dp
    from partitioner.solvers.mopar import hypad, unsplit_plan
    from partitioner.solvers.rl import rl_solver

#: each public name and the module that defines it
_HOMES = {
    "Infeasible": "common",
    "SPLITS": "common",
    "SearchSpace": "common",
    "SolverResult": "common",
    "bo_solver": "bo",
    "hypad": "mopar",
    "latency_dp": "dp",
    "rl_solver": "rl",
    "slo_dp": "dp",
    "unsplit_plan": "mopar",
}

__all__ = ["Infeasible", "SPLITS", "SearchSpace", "SolverResult", "bo_solver", "hypad", "latency_dp", "rl_solver",
           "slo_dp", "unsplit_plan"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'partitioner.solvers' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"partitioner.solvers.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
