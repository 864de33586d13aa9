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
from autoencoder.calibration import CalibrationSet
from autoencoder.compress import ModelSource, PhaseProgress, SplitCompression, compress_split, load_model_graph
from autoencoder.config import TrainConfig
from autoencoder.errors import CompressionError
from autoencoder.export import code_name
from autoencoder.splice import attach_decoder, attach_encoder
from functions.bundle import MANIFEST_SCHEMA, Bundle, sha256_file
from functions.plan import Function, Part, PartInput, Plan, Stage, TensorSpec, full_region
from partitioner.export import export_bundle
from partitioner.graph import LayerGraph
from partitioner.model_file import save_model

__all__ = ["ORIGINAL_FILE", "Placement", "compress_bundle", "uncompressed_bundle", "write_compressed_bundle"]

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
        first, second = plan.stages
        if tensor not in [o.name for o in first.outputs] or tensor not in second.inputs:
            raise CompressionError(f"the stages around unit {u} do not exchange the split tensor {tensor!r}")
        producer = onnx.load(str(plain / first.parts[0].file))
        consumer = onnx.load(str(plain / second.parts[0].file))
        code = TensorSpec(code_name(tensor), sc.split.dtype, sc.code_shape)
        root = work / "bundle"
        (root / "parts").mkdir(parents=True)
        save_model(attach_encoder(producer, tensor, sc.encoder), root / first.parts[0].file)
        save_model(attach_decoder(sc.decoder, tensor, consumer), root / second.parts[0].file)
        save_model(sc.compressed_model(lg.model), root / "source.onnx")
        save_model(lg.model, root / ORIGINAL_FILE)
        new_plan = dataclasses.replace(
            plan,
            stages=(_rename_stage(first, tensor, code), _rename_stage(second, tensor, code)),
            predicted={**plan.predicted, "compression": {"split_after": u, "tensor": tensor, "code": code.name,
                                                         "ratio": sc.achieved_ratio}},
        )
        new_plan = _place(new_plan, placement)
        new_plan.validate()
        new_plan.save(root / "plan.json")
        compression = {
            "kind": "autoencoder",
            "split_after": u,
            "tensor": tensor,
            "code_tensor": code.name,
            "shape_before": list(sc.split.shape),
            "shape_after": list(sc.code_shape),
            "ratio": sc.ratio,
            "achieved_ratio": sc.achieved_ratio,
            "bytes_before": sc.bytes_before,
            "bytes_after": sc.bytes_after,
            "fidelity": sc.fidelity.to_json(),
            "added_ms": sc.added_ms,
            "calibration": sc.calibration,
            "original": ORIGINAL_FILE,
            "original_sha256": source_sha256,
            "source_sha256": sha256_file(root / "source.onnx"),
            "cache_key": sc.cache_key,
        }
        _finish(root, out, source_sha256=source_sha256, source_file=lg.source_path,
                extra={"compression": compression}, tolerance=tolerance,
                reference="source.onnx (the compressed definition)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("wrote compressed bundle %s (R=%.3g after unit %d)", out, sc.achieved_ratio, u)
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
