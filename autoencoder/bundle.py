"""A compressed bundle: two unsplit stages whose edge carries the encoded tensor instead of the split tensor.

The producing part ends with the encoder and outputs ``<tensor>__ae``; the consuming part starts with the
decoder. The plan names the encoded tensor everywhere the split tensor was, so the runtime needs nothing
new. ``source.onnx`` is the *compressed definition* (the original with both convolutions inserted), which
is what the parts reproduce and what ``flatpack run`` checks against; the original model is kept as
``original.onnx`` and the manifest gains a ``compression`` entry (ratio, tensors, shapes, fidelity).

By default each stage runs on its own worker function (MOPAR's vertical slices), so the tensor at the
split really crosses functions through the transport; :func:`uncompressed_bundle` writes the same cut and
placement without the autoencoder, the baseline to compare with.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import onnx

from autoencoder.cache import AutoencoderCache
from autoencoder.compress import ModelSource, PhaseProgress, SplitCompression, compress_split, load_model_graph
from autoencoder.config import TrainConfig
from autoencoder.datasets import CalibrationSet
from autoencoder.errors import CompressionError
from autoencoder.export import code_name
from autoencoder.fidelity import Fidelity
from autoencoder.splice import attach_decoder, attach_encoder
from functions.bundle import MANIFEST_SCHEMA, Bundle, sha256_file
from functions.plan import Function, Part, PartInput, Plan, Stage, TensorSpec, full_region
from partitioner.export import export_bundle
from partitioner.graph import LayerGraph
from partitioner.model_file import save_model

__all__ = ["ORIGINAL_FILE", "Placement", "compress_bundle", "uncompressed_bundle", "write_coded_bundle",
           "write_compressed_bundle"]

log = logging.getLogger(__name__)

#: The uncompressed model inside a compressed bundle.
ORIGINAL_FILE = "original.onnx"


def compress_bundle(
    model: ModelSource,
    split_after_unit: int,
    ratio: float,
    out_dir: str | Path,
    *,
    config: TrainConfig | None = None,
    calibration: CalibrationSet | None = None,
    cache: AutoencoderCache | None = None,
    use_cache: bool = True,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    progress: PhaseProgress | None = None,
    placement: Placement = "slices",
    tolerance: float = 1e-4,
) -> Path:
    """Train (or fetch) the autoencoder for the split after ``split_after_unit`` and write a verified
    two-stage compressed bundle to ``out_dir`` (replacing what is there). Returns ``out_dir``.

    Arguments as :func:`autoencoder.compress_split`; ``placement`` as :func:`write_compressed_bundle`;
    ``tolerance`` bounds the parts' relative error against the compressed definition.

    Raises:
        CompressionError: as :func:`autoencoder.compress_split`, or the bundle does not verify (nothing is
            written then).
    """
    lg, sha = load_model_graph(model, input_shapes)
    sc = compress_split(lg, split_after_unit, ratio, config=config, calibration=calibration, cache=cache,
                        use_cache=use_cache, progress=progress)
    return write_compressed_bundle(lg, sc, out_dir, source_sha256=sha, placement=placement, tolerance=tolerance)


def _rename_stage(stage: Stage, tensor: str, code: TensorSpec) -> Stage:
    def spec(t: TensorSpec) -> TensorSpec:
        return code if t.name == tensor else t

    def part(p: Part) -> Part:
        inputs = tuple(PartInput(code.name, full_region(code.shape)) if i.name == tensor else i for i in p.inputs)
        outputs = tuple(code.name if o == tensor else o for o in p.outputs)
        return dataclasses.replace(p, inputs=inputs, outputs=outputs)

    return dataclasses.replace(
        stage,
        inputs=tuple(code.name if i == tensor else i for i in stage.inputs),
        outputs=tuple(spec(o) for o in stage.outputs),
        parts=tuple(part(p) for p in stage.parts),
        joined=None if stage.joined is None else spec(stage.joined),
    )


Placement = Literal["slices", "master"]


def _place(plan: Plan, placement: Placement) -> Plan:
    """``slices``: stage k runs on function ``worker-{k+1}`` (MOPAR's vertical slices, one function each,
    so the split tensor really crosses functions); ``master``: as exported (every part on the master)."""
    if placement == "master":
        return plan
    if placement != "slices":
        raise ValueError(f"placement must be 'slices' or 'master', got {placement!r}")
    mem = plan.functions[0].memory_mb
    names = [f"worker-{s.index + 1}" for s in plan.stages]
    stages = tuple(
        dataclasses.replace(s, parts=tuple(dataclasses.replace(p, function=name) for p in s.parts))
        for s, name in zip(plan.stages, names, strict=True)
    )
    return dataclasses.replace(plan, functions=(Function(plan.master, mem), *(Function(n, mem) for n in names)),
                               stages=stages)


def _two_stages(lg: LayerGraph, unit: int, work: Path) -> tuple[Path, Plan]:
    plain = export_bundle(lg, f"0-{unit}:none,{unit + 1}-:none", work / "plain")
    plan = Bundle.load(plain).plan
    if len(plan.stages) != 2 or any(len(s.parts) != 1 for s in plan.stages):
        raise CompressionError(f"expected two one-part stages around unit {unit}, got {len(plan.stages)} stages")
    return plain, plan


def _seal(root: Path, out: Path, lg: LayerGraph, plan: Plan, source: onnx.ModelProto, compression: dict[str, Any], *,
          source_sha256: str, tolerance: float, reference: str) -> None:
    """A compressed bundle's plan, ``source`` (the compressed definition) and the original model written into
    ``root``, the manifest's ``compression`` entry naming both, then :func:`_finish`."""
    plan.validate()
    plan.save(root / "plan.json")
    save_model(source, root / "source.onnx")
    save_model(lg.model, root / ORIGINAL_FILE)
    compression = {**compression, "original": ORIGINAL_FILE, "original_sha256": source_sha256,
                   "source_sha256": sha256_file(root / "source.onnx")}
    _finish(root, out, source_sha256=source_sha256, source_file=lg.source_path, extra={"compression": compression},
            tolerance=tolerance, reference=reference)


def _finish(root: Path, out: Path, *, source_sha256: str, source_file: Path | None, extra: dict[str, Any],
            tolerance: float, reference: str) -> None:
    """Manifest, verification against ``source.onnx``, and the move into place."""
    from partitioner.verify import verify_bundle

    _write_manifest(root, source_sha256, source_file, extra)
    seeds = (0, 1)
    report = verify_bundle(root, seeds=seeds, tolerance=tolerance)
    if not report.ok:
        raise CompressionError(
            f"the parts do not reproduce {reference}: max relative error {report.max_rel_err:.3g} > {tolerance:g}"
            f"{' (' + report.error + ')' if report.error else ''}; no bundle written"
        )
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["verification"] = {"seeds": list(seeds), "max_rel_err": report.max_rel_err, "tolerance": tolerance,
                                "reference": reference}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    root.rename(out)


def uncompressed_bundle(model: ModelSource, split_after_unit: int, out_dir: str | Path, *,
                        placement: Placement = "slices",
                        input_shapes: Mapping[str, Sequence[int]] | None = None) -> Path:
    """The same two stages as :func:`compress_bundle` writes, without the autoencoder: the baseline a
    compressed bundle is compared with (same cut, same placement). Returns ``out_dir``.

    Raises:
        CompressionError: ``split_after_unit`` is not a split point of the model.
    """
    lg, sha = load_model_graph(model, input_shapes)
    n = len(lg.units)
    if not 0 <= split_after_unit < n - 1:
        raise CompressionError(f"split after unit {split_after_unit} is not a split point: the model has units "
                               f"0-{n - 1}, so splits lie after units 0-{n - 2}")
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        plain, plan = _two_stages(lg, split_after_unit, work)
        root = work / "bundle"
        shutil.copytree(plain / "parts", root / "parts")
        shutil.copy2(plain / "source.onnx", root / "source.onnx")
        _place(plan, placement).save(root / "plan.json")
        _finish(root, out, source_sha256=sha, source_file=lg.source_path, extra={}, tolerance=1e-4,
                reference="source.onnx (the model)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _code_cut(root: Path, stages: list[Stage], k: int, sc: SplitCompression) -> None:
    """Bake ``sc`` into the bundle at ``root``: the encoder into stage ``k``'s one part, the decoder into stage
    ``k + 1``'s, and the encoded tensor named in both stages where the split tensor was (``stages`` is
    updated in place; stage ``k`` names the codec).

    Raises:
        CompressionError: the stages are not two one-part stages exchanging the split tensor.
    """
    tensor = sc.split.tensor
    first, second = stages[k], stages[k + 1]
    if len(first.parts) != 1 or len(second.parts) != 1:
        raise CompressionError(f"an autoencoder after unit {sc.split.unit} needs one part on each side of the cut; "
                               f"stages {k} and {k + 1} have {len(first.parts)} and {len(second.parts)}")
    if tensor not in [o.name for o in first.outputs] or tensor not in second.inputs:
        raise CompressionError(f"stages {k} and {k + 1} do not exchange the split tensor {tensor!r}")
    producer, consumer = root / first.parts[0].file, root / second.parts[0].file
    save_model(attach_encoder(onnx.load(str(producer)), tensor, sc.encoder), producer)
    save_model(attach_decoder(sc.decoder, tensor, onnx.load(str(consumer))), consumer)
    code = TensorSpec(code_name(tensor), sc.split.dtype, sc.code_shape)
    stages[k] = dataclasses.replace(_rename_stage(first, tensor, code), codec=f"ae:{sc.ratio:g}")
    stages[k + 1] = _rename_stage(second, tensor, code)


def _edge_json(sc: SplitCompression) -> dict[str, Any]:
    return {
        "split_after": sc.split.unit,
        "tensor": sc.split.tensor,
        "code_tensor": code_name(sc.split.tensor),
        "shape_before": list(sc.split.shape),
        "shape_after": list(sc.code_shape),
        "ratio": sc.ratio,
        "achieved_ratio": sc.achieved_ratio,
        "bytes_before": sc.bytes_before,
        "bytes_after": sc.bytes_after,
        "fidelity": sc.fidelity.to_json(),
        "added_ms": sc.added_ms,
        "calibration": sc.calibration,
        "cache_key": sc.cache_key,
    }


def write_compressed_bundle(lg: LayerGraph, sc: SplitCompression, out_dir: str | Path, *, source_sha256: str,
                            placement: Placement = "slices", tolerance: float = 1e-4) -> Path:
    """Write the compressed bundle for ``sc`` (trained on ``lg``) to ``out_dir`` and verify it.

    ``placement``: ``slices`` (default) runs each stage on its own worker function, so the encoded tensor
    crosses functions through the transport; ``master`` keeps both parts on the master.

    Raises:
        CompressionError: the bundle does not reproduce the compressed definition within ``tolerance``.
    """
    u, tensor = sc.split.unit, sc.split.tensor
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        plain, plan = _two_stages(lg, u, work)
        root = work / "bundle"
        shutil.copytree(plain / "parts", root / "parts")
        stages = list(plan.stages)
        _code_cut(root, stages, 0, sc)
        new_plan = dataclasses.replace(
            plan,
            stages=tuple(stages),
            predicted={**plan.predicted, "compression": {"split_after": u, "tensor": tensor, "code": code_name(tensor),
                                                         "ratio": sc.achieved_ratio}},
        )
        _seal(root, out, lg, _place(new_plan, placement), sc.compressed_model(lg.model),
              {"kind": "autoencoder", **_edge_json(sc)}, source_sha256=source_sha256, tolerance=tolerance,
              reference="source.onnx (the compressed definition)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("wrote compressed bundle %s (R=%.3g after unit %d)", out, sc.achieved_ratio, u)
    return out


def write_coded_bundle(plain: str | Path, lg: LayerGraph, compressions: Sequence[SplitCompression],
                       out_dir: str | Path, *, source_sha256: str, fidelity: Fidelity | None = None,
                       tolerance: float = 1e-4) -> Path:
    """A planned bundle (``plain``, as :func:`partitioner.planner.export_solution` writes it) with an
    autoencoder baked in at each cut of ``compressions``: the encoder into the part before the cut, the
    decoder into the part after it, the encoded tensor crossing instead. ``source.onnx`` becomes the model
    with every autoencoder inserted (what the parts are verified against and ``flatpack run`` checks),
    ``original.onnx`` the model; the manifest's ``compression`` lists the cuts and ``fidelity`` (the whole
    compressed model's, when given). Written to ``out_dir`` (replacing it) once verified.

    Raises:
        CompressionError: a cut that is not between two one-part stages of the plan, or parts that do not
            reproduce the compressed definition within ``tolerance`` (nothing is written then).
    """
    plan = Bundle.load(plain).plan
    ends = {s.units[1]: s.index for s in plan.stages[:-1]}
    missing = sorted(sc.split.unit for sc in compressions if sc.split.unit not in ends)
    if missing:
        raise CompressionError(f"the plan has no cut after units {missing}; its cuts lie after units {sorted(ends)}")
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        root = work / "bundle"
        shutil.copytree(Path(plain) / "parts", root / "parts")
        stages = list(plan.stages)
        model = lg.model
        for sc in sorted(compressions, key=lambda c: c.split.unit):
            _code_cut(root, stages, ends[sc.split.unit], sc)
            model = sc.compressed_model(model)
        predicted = {**plan.predicted, **({"fidelity": fidelity.to_json()} if fidelity is not None else {})}
        compression = {"kind": "autoencoders", "edges": [_edge_json(sc) for sc in compressions],
                       "fidelity": None if fidelity is None else fidelity.to_json()}
        _seal(root, out, lg, dataclasses.replace(plan, stages=tuple(stages), predicted=predicted), model, compression,
              source_sha256=source_sha256, tolerance=tolerance,
              reference="source.onnx (the model with its autoencoders)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("wrote bundle %s with autoencoders after units %s", out, [sc.split.unit for sc in compressions])
    return out


def _write_manifest(root: Path, source_sha: str, source_file: Path | None, extra: dict[str, Any]) -> None:
    files = {
        str(p.relative_to(root)): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "source": {"file": None if source_file is None else str(source_file), "sha256": source_sha},
        "files": files,
        **extra,
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
