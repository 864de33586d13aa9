"""The planning pipeline, once: a model and a request in, a planned model out.

    planned = plan_model(path, request, shapes=fixes, on_target=solve_on_target, codecs=place_autoencoders)

load the layer graph (shapes fixed) -> the performance model (profiled units, the platform's figures) ->
the codecs a mode may place (MOPAR's autoencoders: :class:`CodecPlacer`) -> solve, on the target where a
caller can time plans there (:class:`OnTarget`; ``serving.calibrate.stages.solve_on_target`` deploys the
plan's stages on the local platform and re-plans with what they took) -> :class:`PlannedModel`.

``flatpack plan`` and ``flatpack deploy`` call it; exporting, deploying and the live check that follows
(``serving.deploy.promise``) take the planned model from here. The hooks are Protocols so that the offline
side names what it needs and the serving side (which may deploy) provides it: nothing here starts a process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from partitioner.graph import LayerGraph
    from partitioner.normalize import ShapeFixes
    from partitioner.perfmodel import PerfModel
    from partitioner.planner import PlanRequest
    from partitioner.solvers.common import SolverResult
    from partitioner.stage_times import Refined

__all__ = ["CodecPlacer", "OnTarget", "PlannedModel", "plan_model"]

Progress = Callable[[str], None]


class OnTarget(Protocol):
    """Plans ``lg`` as ``request`` says with ``pm``, timing plans on the target where it can; returns the
    result and the refinement (None where nothing was measured). Raises what the planner raises."""

    def __call__(self, lg: LayerGraph, request: PlanRequest, pm: PerfModel, *,
                 progress: Progress | None = None) -> tuple[SolverResult, Refined | None]: ...


class CodecPlacer(Protocol):
    """The request with the codecs its mode may place at cuts attached (MOPAR's autoencoders), and a note for
    the plan on where they may go or why none can."""

    def __call__(self, lg: LayerGraph, request: PlanRequest, options: Any, *,
                 progress: Progress | None = None) -> tuple[PlanRequest, str]: ...


@dataclass(frozen=True)
class PlannedModel:
    """A model planned for a request: its layer graph, the request as planned (codecs attached), the
    performance model the plan was priced with (stage times and live corrections applied: a re-plan
    continues from it), the solver's result, where its figures came from, and what was measured."""

    lg: LayerGraph
    request: PlanRequest
    pm: PerfModel
    result: SolverResult
    source: str
    refined: Refined | None = None


def plan_model(model: str | Path, request: PlanRequest, *, shapes: ShapeFixes | None = None,
               on_target: OnTarget | None = None, codecs: CodecPlacer | None = None, codec_options: Any = None,
               progress: Progress | None = None,
               unit_progress: Callable[[int, int, str], None] | None = None) -> PlannedModel:
    """Plan ``model`` (an ONNX file) as ``request`` says (see the module docstring). Without ``on_target`` the
    plan is solved from the model alone, its percentile sampled. Raises ``partitioner.solvers.common.Infeasible``
    (with the fastest plan) where no plan meets the SLO, ``partitioner.errors.ModelError`` for a model it cannot
    load, ValueError for a request it cannot plan."""
    from partitioner.graph import LayerGraph
    from partitioner.normalize import ShapeFixes
    from partitioner.planner import make_perfmodel, solve, with_sampled_tail

    say = progress or (lambda _m: None)
    path = Path(model)
    say(f"loading {path.name}")
    shapes = shapes or ShapeFixes()
    lg = LayerGraph.load(path, shapes.inputs, shapes.dims)
    say("profiling (cached per model)")
    pm, _, source = make_perfmodel(lg, request, progress=say, unit_progress=unit_progress)
    note = ""
    if codecs is not None:
        request, note = codecs(lg, request, codec_options, progress=say)
    say(f"planning ({request.mode}{', ' + request.solver if request.solver else ''})")
    if on_target is not None:
        result, refined = on_target(lg, request, pm, progress=say)
    else:
        result, refined = with_sampled_tail(pm, solve(lg, request, pm=pm)), None
    if refined is not None and (refined.rounds or any(refined.timed)):
        source = f"{source}; {refined.summary()}"
    return PlannedModel(lg, request, pm, result.noted(note), source, refined)
