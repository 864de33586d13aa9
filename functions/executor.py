"""Stage-by-stage execution of a plan: slice inputs, run parts, join, run the epilogue.

The same loop serves the in-process executor (verification, tests) and the master function; they
differ only in how a stage's parts are run (``PartRunner``). Joining follows the plan exactly:
``place`` writes each part's output into its region of the joined tensor, ``sum`` adds partial sums
in part order (a fixed order, so results are reproducible), ``none`` takes the single part's outputs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from functions.errors import BadInput
from functions.plan import Part, Plan, Region, Stage
from functions.session import SessionCache

__all__ = [
    "InProcessRunner",
    "PartRunner",
    "bad_input",
    "execute_plan",
    "join_stage",
    "part_inputs",
    "region_slices",
]

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]


def region_slices(region: Region) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in region)


class PartRunner(Protocol):
    """Runs all parts of one stage (concurrently, if it can) and returns their outputs in part order."""

    def run_stage(self, stage: Stage, inputs: Sequence[Tensors]) -> list[Tensors]: ...


def part_inputs(part: Part, env: Mapping[str, np.ndarray]) -> Tensors:
    """The part's input regions, cut from the tensors the master holds (views, not copies)."""
    out: Tensors = {}
    for pi in part.inputs:
        try:
            tensor = env[pi.name]
        except KeyError as e:
            raise RuntimeError(f"part {part.file} needs tensor {pi.name!r}, which no earlier stage produced") from e
        out[pi.name] = tensor[region_slices(pi.region)]
    return out


def join_stage(stage: Stage, results: Sequence[Tensors]) -> Tensors:
    """Join the parts' outputs as the stage says; returns the joined tensor(s) by name."""
    if stage.join == "none":
        if len(results) != 1:
            raise RuntimeError(f"stage {stage.index} has join 'none' but {len(results)} parts")
        return dict(results[0])
    joined = stage.joined
    assert joined is not None  # Plan.validate guarantees it for split stages
    if stage.join == "place":
        out = np.empty(joined.shape, dtype=np.dtype(joined.dtype))
        for part, res in zip(stage.parts, results, strict=True):
            assert part.output_region is not None
            out[region_slices(part.output_region)] = res[part.outputs[0]]
        return {joined.name: out}
    # sum: partial sums in part order
    total: np.ndarray | None = None
    for part, res in zip(stage.parts, results, strict=True):
        r = res[part.outputs[0]]
        if total is None:
            total = np.array(r, dtype=np.dtype(joined.dtype), copy=True)
        else:
            total += r
    assert total is not None
    return {joined.name: total}


def execute_plan(
    plan: Plan,
    inputs: Mapping[str, np.ndarray],
    runner: PartRunner,
    run_epilogue: Callable[[Stage, Tensors], Tensors],
) -> Tensors:
    """Run ``plan`` on ``inputs`` (model input name -> array) and return the model outputs by name.

    Tensors are dropped from the master's memory as soon as no later stage needs them.
    """
    missing = [t.name for t in plan.model.inputs if t.name not in inputs]
    if missing:
        raise ValueError(f"missing model input(s) {missing}; the model takes {[t.name for t in plan.model.inputs]}")
    # a runner may hand in tensors of its own kind (the master's inputs left in shared memory): anything with
    # a shape and a dtype is kept as it is and cut into regions by indexing
    env: Tensors = {k: v if hasattr(v, "shape") and hasattr(v, "dtype") else np.asarray(v) for k, v in inputs.items()}
    given = dict(env)
    last_use = _last_uses(plan)
    final = {t.name for t in plan.model.outputs}
    for stage in plan.stages:
        try:
            results = runner.run_stage(stage, [part_inputs(p, env) for p in stage.parts])
            env.update(join_stage(stage, results))
            if stage.epilogue is not None:
                env.update(run_epilogue(stage, env))
        except Exception as e:
            bad = bad_input(e, given)
            if bad is not None:
                raise bad from e
            raise
        for name in [n for n, last in last_use.items() if last == stage.index and n not in final]:
            env.pop(name, None)
    return {name: env[name] for name in (t.name for t in plan.model.outputs)}


# onnxruntime's words for an index out of its axis (Gather, GatherElements, ScatterND, OneHot, ...)
_OUT_OF_RANGE = re.compile(r"INVALID_ARGUMENT.*(out of (data )?bounds|out of range|must be within)", re.S)
_RANGE = re.compile(r"range \[\s*(-?\d+)\s*,\s*(-?\d+)\s*\]")


def bad_input(error: BaseException, inputs: Mapping[str, np.ndarray]) -> BadInput | None:
    """The client's error behind ``error``, where it is one: onnxruntime refusing an index out of range that
    came from the request's integer inputs. It names the inputs that hold values outside the range
    onnxruntime states (every integer input, where it states none); None for any other failure."""
    text = str(error)
    if not _OUT_OF_RANGE.search(text):
        return None
    integer = {n: np.asarray(v) for n, v in inputs.items()
               if np.dtype(v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype).kind in "iu"}
    if not integer:
        return None
    m = _RANGE.search(text)
    names = list(integer)
    detail = ""
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        outside = [n for n, v in integer.items() if v.size and (int(v.min()) < lo or int(v.max()) > hi)]
        if outside:
            names = outside
            v = integer[names[0]]
            detail = f" (values {int(v.min())}..{int(v.max())}; it takes {max(lo, 0)}..{hi})"
    which = ", ".join(repr(n) for n in names)
    cause = text.splitlines()[0][:300] if text else type(error).__name__
    return BadInput(f"input {which} holds an index out of range for the model{detail}; onnxruntime: {cause}")


def _last_uses(plan: Plan) -> dict[str, int]:
    last: dict[str, int] = {}
    for stage in plan.stages:
        for name in stage.inputs:
            last[name] = stage.index
        if stage.joined is not None:
            last.setdefault(stage.joined.name, stage.index)
    return last


class InProcessRunner:
    """Runs every part in this process with onnxruntime, one after another.

    Sessions are cached per part file for the life of the runner.
    """

    def __init__(self, bundle_dir: str | Path, *, intra_op_threads: int = 0) -> None:
        self._dir = Path(bundle_dir)
        self._sessions = SessionCache(intra_op_threads=intra_op_threads)
        self._paths: dict[str, Path] = {}  # a Path joined and hashed per request costs more than a lookup

    def run_stage(self, stage: Stage, inputs: Sequence[Tensors]) -> list[Tensors]:
        return [self.run_file(p.file, x) for p, x in zip(stage.parts, inputs, strict=True)]

    def run_file(self, file: str, inputs: Mapping[str, np.ndarray]) -> Tensors:
        path = self._paths.get(file)
        if path is None:
            path = self._paths[file] = self._dir / file
        return self._sessions.run(path, inputs)

    def run_epilogue(self, stage: Stage, env: Mapping[str, np.ndarray]) -> Tensors:
        assert stage.epilogue is not None
        names = self._sessions.input_names(self._dir / stage.epilogue)
        return self.run_file(stage.epilogue, {n: env[n] for n in names})

    def execute(self, plan: Plan, inputs: Mapping[str, np.ndarray]) -> Tensors:
        return execute_plan(plan, inputs, self, self.run_epilogue)
