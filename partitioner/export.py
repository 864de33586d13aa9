"""Writing a plan into a bundle: one ONNX file per part, plan.json, manifest.json, source.onnx.

Export verifies before it writes: the bundle is assembled in a temporary directory next to the target,
run through the in-process executor on random inputs, compared with the unsplit model, and only then
moved into place. A bundle that does not reproduce the model is never left on disk.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from functions.bundle import MANIFEST_SCHEMA, sha256_file
from functions.compare import DEFAULT_TOLERANCE
from functions.plan import JOIN_KINDS, Function, ModelInfo, Part, Plan, Stage, TensorSpec
from partitioner.errors import ExportError, NotSplittable, SpecError
from partitioner.graph import LayerGraph
from partitioner.model_file import PROTOBUF_LIMIT_BYTES, save_model, serialized_bytes, tensor_nbytes
from partitioner.normalize import fixed_dims
from partitioner.parts import PartModel, StageCut, cut_stage
from partitioner.spec import StageSpec, parse_stages

__all__ = [
    "DEFAULT_TOLERANCE", "Placement", "build_plan", "export_bundle", "stage_record", "worker_name",
    "write_stage_files",
]

log = logging.getLogger(__name__)

# Placeholder memory sizing until a planner decides: runtime base + 1.5 x (weights + activations).
_RUNTIME_BASE_MB = 160


@dataclass(frozen=True)
class Placement:
    """Where a stage's parts run: part 0 on the master (``master_part``) or every part on workers;
    workers get ``worker_mb`` of memory (0: sized to what their part needs)."""

    master_part: bool = True
    worker_mb: int = 0


def worker_name(stage: int, part: int) -> str:
    return f"s{stage:02d}-p{part:02d}"


def stage_record(cut: StageCut, index: int, placement: Placement = Placement()
                 ) -> tuple[Stage, dict[str, onnx.ModelProto]]:
    """The plan's Stage for a cut, with part k on the master or on worker function ``sNN-pKK``."""
    join = cut.join
    if join not in JOIN_KINDS:
        raise ExportError(f"stage {index}: the cut's join {join!r} is not one of {', '.join(JOIN_KINDS)}")
    files: dict[str, onnx.ModelProto] = {}
    parts = []
    for k, pm in enumerate(cut.parts):
        rel = f"parts/s{index:02d}_p{k:02d}.onnx"
        files[rel] = pm.model
        outputs = (pm.output,) if cut.join != "none" else tuple(o.name for o in cut.outputs)
        region = pm.output_region if cut.join != "none" else None
        function = "master" if (k == 0 and placement.master_part) else worker_name(index, k)
        parts.append(Part(k, function, rel, pm.inputs, outputs, region))
    epilogue = None
    if cut.epilogue is not None:
        epilogue = f"parts/s{index:02d}_epilogue.onnx"
        files[epilogue] = cut.epilogue
    stage = Stage(index, (cut.first, cut.last), cut.split, cut.inputs, cut.outputs, tuple(parts),
                  join, cut.joined, epilogue)
    return stage, files


def write_stage_files(root: Path, files: Mapping[str, onnx.ModelProto]) -> None:
    for rel, model in files.items():
        save_model(model, root / rel)


def _part_need_mb(lg: LayerGraph, part: PartModel) -> float:
    weights = sum(tensor_nbytes(t) for t in part.model.graph.initializer)
    acts = sum(lg.tensors[x.name].dtype.itemsize * _numel(x.region) for x in part.inputs)
    return _RUNTIME_BASE_MB + 1.5 * (weights + 3 * acts) / 2**20


def _round_mb(mb: float, step: int = 64) -> int:
    return int(-(-mb // step) * step)


def _numel(region: Sequence[tuple[int, int]]) -> int:
    n = 1
    for a, b in region:
        n *= b - a
    return n


def build_plan(lg: LayerGraph, stages: Sequence[StageSpec], *, source_sha256: str,
               placements: Sequence[Placement] | None = None, master_mb: int | None = None,
               platform: str = "local", transport: str = "inline", mode: str = "manual",
               predicted: Mapping[str, object] | None = None,
               progress: Callable[[str], None] | None = None) -> tuple[Plan, dict[str, onnx.ModelProto]]:
    """Cut every stage and assemble the plan: the master runs part 0 of each stage unless a placement
    says otherwise; every other part is its own worker function (so each holds only its own weights)."""
    placements = list(placements) if placements is not None else [Placement()] * len(stages)
    if len(placements) != len(stages):
        raise ValueError(f"{len(placements)} placements for {len(stages)} stages")
    cuts: list[StageCut] = []
    for first, last, split in stages:
        if progress:
            progress(f"cutting units {first}-{last} ({split})")
        try:
            cuts.append(cut_stage(lg, first, last, split))
        except NotSplittable as e:
            raise SpecError(f"units {first}-{last} cannot be split as {split}: {e}") from e
    files: dict[str, onnx.ModelProto] = {}
    records = []
    workers: dict[str, int] = {}
    master_need = float(_RUNTIME_BASE_MB)
    for i, (cut, place) in enumerate(zip(cuts, placements, strict=True)):
        stage, f = stage_record(cut, i, place)
        records.append(stage)
        files.update(f)
        for part, pm in zip(stage.parts, cut.parts, strict=True):
            need = _part_need_mb(lg, pm)
            if part.function == "master":
                master_need += need - _RUNTIME_BASE_MB
            else:
                workers[part.function] = place.worker_mb or _round_mb(need)
    functions = (Function("master", master_mb or _round_mb(master_need)),
                 *(Function(name, mb) for name, mb in workers.items()))
    info = ModelInfo(
        name=lg.name,
        sha256=source_sha256,
        inputs=tuple(TensorSpec(x, lg.tensors[x].dtype.name, lg.tensors[x].shape) for x in lg.inputs),
        outputs=tuple(TensorSpec(x, lg.tensors[x].dtype.name, lg.tensors[x].shape) for x in lg.outputs),
        dims=fixed_dims(lg.model),
    )
    plan = Plan(model=info, functions=functions, stages=tuple(records), platform=platform, transport=transport,
                mode=mode, predicted=dict(predicted or {}))
    plan.validate()
    return plan, files


def export_bundle(
    model: str | Path | onnx.ModelProto | LayerGraph,
    stages: str | Sequence[StageSpec],
    out: str | Path,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    seeds: Sequence[int] = (0, 1),
    tolerance: float = DEFAULT_TOLERANCE,
    overwrite: bool = True,
    placements: Sequence[Placement] | None = None,
    master_mb: int | None = None,
    platform: str = "local",
    transport: str = "inline",
    mode: str = "manual",
    predicted: Mapping[str, object] | None = None,
    progress: Callable[[str], None] | None = None,
    backend: str = "onnxruntime",
) -> Path:
    """Cut ``model`` as ``stages`` say, verify the parts reproduce it, and write the bundle to ``out``.

    Raises SpecError for a stage spec that does not fit the model, ExportError if the parts do not
    reproduce the model within ``tolerance`` (relative to max(1, max|output|)); nothing is written then.
    ``input_shapes`` and ``dims`` fix a model file's dynamic input dimensions (see ``LayerGraph.load``);
    the plan records the fixed shapes and symbolic dimensions. ``backend`` other than onnxruntime writes
    the parts in the form that backend imports (``mxnet``: opset 13, initializers as graph inputs) and
    raises UnsupportedByBackend for parts it cannot run; the bundle is still verified with onnxruntime.
    """
    from partitioner.verify import verify_bundle  # verify imports export's helpers

    lg = model if isinstance(model, LayerGraph) else LayerGraph.load(model, input_shapes, dims)
    if lg.source_path is not None:
        source_sha = sha256_file(lg.source_path)
    else:
        small = serialized_bytes(lg.model) < PROTOBUF_LIMIT_BYTES
        source_sha = hashlib.sha256(lg.model.SerializeToString()).hexdigest() if small else ""
    specs = parse_stages(stages, len(lg.units)) if isinstance(stages, str) else list(stages)
    plan, files = build_plan(lg, specs, source_sha256=source_sha, placements=placements, master_mb=master_mb,
                             platform=platform, transport=transport, mode=mode, predicted=predicted,
                             progress=progress)
    if backend != "onnxruntime":
        from partitioner.backends import parts_for_backend

        if progress:
            progress(f"rewriting {len(files)} part files for {backend}")
        files = parts_for_backend(files, backend)
    out = Path(out)
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists; remove it or pass overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if progress:
            progress(f"writing {len(files)} part files")
        write_stage_files(tmp, files)
        save_model(lg.model, tmp / "source.onnx")
        plan.save(tmp / "plan.json")
        _write_manifest(tmp, source_sha, lg.source_path)
        if progress:
            progress("verifying the parts against the unsplit model")
        report = verify_bundle(tmp, seeds=seeds, check_hashes=False, tolerance=tolerance)
        if report.max_rel_err > tolerance or not report.ok:
            raise ExportError(
                f"the parts do not reproduce the model: max relative error {report.max_rel_err:.3g} > {tolerance:g}"
                f"{' (' + report.error + ')' if report.error else ''}; no bundle written"
            )
        manifest = json.loads((tmp / "manifest.json").read_text())
        manifest["verification"] = {"seeds": list(seeds), "max_rel_err": report.max_rel_err, "tolerance": tolerance}
        if backend != "onnxruntime":
            manifest["backend"] = backend
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("wrote bundle %s (%d stages, %d parts)", out, len(plan.stages), sum(len(s.parts) for s in plan.stages))
    return out


def _write_manifest(root: Path, source_sha: str, model: object) -> None:
    files = {
        str(p.relative_to(root)): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("manifest.json", "plan.json")
    }
    files["plan.json"] = sha256_file(root / "plan.json")
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "source": {"file": str(model) if isinstance(model, str | Path) else None, "sha256": source_sha},
        "files": files,
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
