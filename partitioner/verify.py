"""Numerical verification: split execution must equal the unsplit model.

The error measure everywhere is ``max|split - full| / max(1, max|full|)`` over every output (float32
bar: 1e-4). ``verify_bundle`` runs a whole bundle through the in-process executor; ``verify_options``
checks every admissible split option of every unit (and a sample of multi-unit groups) in isolation,
feeding each stage the exact tensors the unsplit model produces at its cut points.
"""

from __future__ import annotations

import logging
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from functions.bundle import Bundle
from functions.compare import DEFAULT_TOLERANCE, rel_err
from functions.executor import InProcessRunner, join_stage, part_inputs
from functions.plan import Split, split_family
from functions.session import make_session
from partitioner.errors import NotSplittable
from partitioner.export import stage_record, write_stage_files
from partitioner.graph import LayerGraph
from partitioner.inputs import random_inputs
from partitioner.model_file import save_model
from partitioner.parts import CutStage

__all__ = ["OptionResult", "VerifyReport", "candidate_options", "verify_bundle", "verify_options"]

log = logging.getLogger(__name__)

SPATIAL_GRIDS_2D = ((1, 2), (2, 1), (2, 2), (3, 2), (3, 3), (4, 4), (8, 8))
SPATIAL_GRIDS_1D = ((2, 1), (3, 1), (4, 1))
CHANNEL_DEGREES = (2, 3, 4, 8)
REDUCTION_DEGREES = (2, 3, 4)
EMBEDDING_DEGREES = (2, 3, 4)


@dataclass
class VerifyReport:
    checked: int = 0
    failed: int = 0
    max_rel_err: float = 0.0
    error: str | None = None
    failures: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.error is None


def verify_bundle(root: str | Path, *, seeds: Sequence[int] = (0, 1), check_hashes: bool = True,
                  tolerance: float = DEFAULT_TOLERANCE) -> VerifyReport:
    """Run the bundle on random inputs and compare with its source model."""
    bundle = Bundle.load(root, check_hashes=check_hashes)
    runner = InProcessRunner(bundle.root)
    ref = make_session(bundle.source)
    names = [o.name for o in ref.get_outputs()]
    source = onnx.load(str(bundle.source), load_external_data=False)
    report = VerifyReport()
    for seed in seeds:
        inputs = random_inputs(source, seed)
        want = dict(zip(names, ref.run(names, inputs), strict=True))
        try:
            got = runner.execute(bundle.plan, inputs)
        except Exception as e:  # noqa: BLE001 - any failure of the parts is a verification failure
            report.error = f"{type(e).__name__}: {e}"
            report.failed += 1
            log.debug("bundle run failed: %s", traceback.format_exc())
            continue
        err = max(rel_err(got[n], want[n]) for n in names)
        report.checked += 1
        report.max_rel_err = max(report.max_rel_err, err)
        if err > tolerance:
            report.failed += 1
            report.failures.append({"seed": seed, "rel_err": err})
    return report


@dataclass(frozen=True)
class OptionResult:
    first: int
    last: int
    split: Split
    rel_err: float | None  # None: not admissible
    reason: str = ""

    def as_dict(self) -> dict[str, object]:
        """The option as a report line: ``{"units": "2-2", "family": "heads", "split": "heads=2", ...}``."""
        out: dict[str, object] = {"units": f"{self.first}-{self.last}", "family": self.split.family,
                                  "split": str(self.split), "rel_err": self.rel_err}
        if self.reason:
            out["reason"] = self.reason
        return out


def candidate_options(lg: LayerGraph, *, group_sizes: Sequence[int] = (2, 3), group_stride: int | None = None
                      ) -> list[tuple[int, int, Split]]:
    """Every split option of every unit, plus multi-unit groups starting every ``group_stride`` units
    (every unit for models of up to 12 units, every other one above)."""
    opts: list[tuple[int, int, Split]] = []
    n = len(lg.units)
    group_stride = group_stride or (1 if n <= 12 else 2)
    for u in range(n):
        opts.extend((u, u, s) for s in _options_for(lg, u, u, full_sweep=True))
    for size in group_sizes:
        for start in range(0, n - size + 1, group_stride):
            opts.extend((start, start + size - 1, s) for s in _options_for(lg, start, start + size - 1, False))
    return opts


def _options_for(lg: LayerGraph, first: int, last: int, full_sweep: bool) -> list[Split]:
    try:
        cs = CutStage(lg, first, last)
        _, spatial = cs.axes()
    except NotSplittable:
        return []
    out: list[Split] = []
    grids = SPATIAL_GRIDS_2D if len(spatial) == 2 else SPATIAL_GRIDS_1D if spatial else ()
    out += [Split("spatial", g) for g in (grids if full_sweep else grids[2:3] or grids[:1])]
    out += [Split("channel", (d,)) for d in (CHANNEL_DEGREES if full_sweep else (2,))]
    try:
        cs.embedding()
        out += [Split("embedding", (d,)) for d in (EMBEDDING_DEGREES if full_sweep else (2,))]
    except NotSplittable:
        pass
    try:
        family = split_family(cs.family_of_reduction())
        k, align = cs.reduction_axis(cs.reduction_op())
    except NotSplittable:
        return out
    if family == "heads":
        heads = k // align
        degrees = sorted({*range(2, min(heads, 4) + 1), heads} if full_sweep else {2})
    else:
        degrees = list(REDUCTION_DEGREES if full_sweep else (2,))
    out += [Split(family, (d,)) for d in degrees]
    return out


def verify_options(
    lg: LayerGraph,
    options: Sequence[tuple[int, int, Split]] | None = None,
    *,
    seed: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
    progress: Callable[[int, int, str], None] | None = None,
) -> tuple[VerifyReport, list[OptionResult]]:
    """Check each option in isolation against the unsplit model's own tensors at its cut points."""
    options = candidate_options(lg) if options is None else options
    inputs = random_inputs(lg.model, seed)
    env = reference_tensors(lg, inputs)
    report = VerifyReport()
    results: list[OptionResult] = []
    with tempfile.TemporaryDirectory(prefix="flatpack-verify-") as tmp:
        for i, (first, last, split) in enumerate(options):
            label = f"units {first}-{last} {split}"
            if progress:
                progress(i, len(options), label)
            try:
                cs = CutStage(lg, first, last)
                cut = cs.cut(split)
            except NotSplittable as e:
                results.append(OptionResult(first, last, split, None, str(e)))
                continue
            root = Path(tmp) / f"o{i}"
            stage, files = stage_record(cut, 0)
            write_stage_files(root, files)
            runner = InProcessRunner(root)
            crashed = False
            try:
                outs = join_stage(stage, runner.run_stage(stage, [part_inputs(p, env) for p in stage.parts]))
                if stage.epilogue is not None:
                    outs.update(runner.run_epilogue(stage, {**env, **outs}))
                err = max(rel_err(outs[o.name], env[o.name]) for o in stage.outputs)
            except Exception as e:  # noqa: BLE001 - a crash of a part is a failed check, reported with its cause
                err, crashed = float("inf"), True
                report.failures.append({"units": f"{first}-{last}", "split": str(split), "error": f"{e}"})
            report.checked += 1
            report.max_rel_err = max(report.max_rel_err, err)
            if err > tolerance:
                report.failed += 1
                if not crashed:  # inf here: integers that differ, a shape mismatch or a NaN
                    report.failures.append({"units": f"{first}-{last}", "split": str(split), "rel_err": err})
            results.append(OptionResult(first, last, split, err))
        if progress:
            progress(len(options), len(options), "done")
    return report, results


def reference_tensors(lg: LayerGraph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the unsplit model once, exposing every cut tensor, and return them with the inputs."""
    model = onnx.ModelProto()
    model.CopyFrom(lg.model)
    have = {o.name for o in model.graph.output}
    for u in lg.units:
        if u.output and u.output not in have:
            t = lg.tensors[u.output]
            model.graph.output.append(
                helper.make_tensor_value_info(u.output, helper.np_dtype_to_tensor_dtype(t.dtype), t.shape))
            have.add(u.output)
    with tempfile.TemporaryDirectory(prefix="flatpack-ref-") as tmp:
        path = Path(tmp) / "ref.onnx"
        save_model(model, path)
        sess = make_session(path)
        names = [o.name for o in sess.get_outputs()]
        outs = dict(zip(names, sess.run(names, dict(inputs)), strict=True))
    return {**inputs, **outs}
