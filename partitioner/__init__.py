"""The offline side: an ONNX model in, a verified bundle (plan.json + one ONNX file per part) out.

The flow, one module per step: :mod:`~partitioner.graph` (the model as a chain of fused units),
:mod:`~partitioner.profile` and :mod:`~partitioner.predictors` (unit times, measured or predicted),
:mod:`~partitioner.perfmodel` (latency, cost and memory of any plan on a platform profile),
:mod:`~partitioner.solvers` (a plan per mode), :mod:`~partitioner.planner` (the pipeline from a
:class:`PlanRequest` to a solution) and :mod:`~partitioner.export` / :mod:`~partitioner.verify` (the bundle,
checked against the model).

``__all__`` is the surface other packages use. Importing the package is cheap: each name is imported from
its module on first use (PEP 562), so ``import partitioner`` loads neither onnxruntime nor torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from partitioner.errors import ExportError, ModelError, NotSplittable, SpecError
    from partitioner.export import Placement, export_bundle
    from partitioner.graph import LayerGraph
    from partitioner.normalize import ShapeFixes
    from partitioner.perfmodel import ComputeModel, PerfModel, PlatformFacts, StageChoice
    from partitioner.planner import PlanRequest, export_solution, make_perfmodel, solve
    from partitioner.spec import parse_stages
    from partitioner.verify import verify_bundle

#: each public name and the module that defines it
_HOMES = {
    "ComputeModel": "perfmodel",
    "ExportError": "errors",
    "LayerGraph": "graph",
    "ModelError": "errors",
    "NotSplittable": "errors",
    "PerfModel": "perfmodel",
    "Placement": "export",
    "PlanRequest": "planner",
    "PlatformFacts": "perfmodel",
    "ShapeFixes": "normalize",
    "SpecError": "errors",
    "StageChoice": "perfmodel",
    "export_bundle": "export",
    "export_solution": "planner",
    "make_perfmodel": "planner",
    "parse_stages": "spec",
    "solve": "planner",
    "verify_bundle": "verify",
}

__all__ = ["ComputeModel", "ExportError", "LayerGraph", "ModelError", "NotSplittable", "PerfModel", "Placement",
           "PlanRequest", "PlatformFacts", "ShapeFixes", "SpecError", "StageChoice", "export_bundle",
           "export_solution", "make_perfmodel", "parse_stages", "solve", "verify_bundle"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'partitioner' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"partitioner.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
