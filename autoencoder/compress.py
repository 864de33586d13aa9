"""Compressing one split point (MOPAR section II-D): collect activations, train, export, evaluate.

:func:`compress_split` runs the model's prefix on augmented calibration inputs (the training split only),
trains a one-conv encoder / one-conv decoder pair for the requested ratio, writes both as ONNX, inserts
them into the model, and measures on held-out inputs how far the compressed model's outputs move
(accuracy with labels, top-1 agreement and relative error without), the time the pair adds, and what the
lossless codecs achieve on the same tensors. Results are cached (see :mod:`autoencoder.cache`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.utils

from autoencoder.cache import AutoencoderCache, cache_key
from autoencoder.config import TrainConfig
from autoencoder.datasets import CalibrationSet, calibration_for
from autoencoder.design import AEDesign, design_for
from autoencoder.errors import CompressionError
from autoencoder.export import decoder_model, encoder_model
from autoencoder.fidelity import Fidelity, measure_fidelity
from autoencoder.lossless import LosslessResult, measure_lossless
from autoencoder.runner import BatchRunner, session_for
from autoencoder.splice import insert_autoencoder
from functions.filelock import exclusive
from partitioner.errors import ModelError
from partitioner.graph import LayerGraph

__all__ = [
    "ModelSource",
    "PhaseProgress",
    "SplitCompression",
    "SplitPoint",
    "cached_split",
    "compress_split",
    "conv_split_units",
    "load_model_graph",
    "prefix_model",
    "split_point",
]

log = logging.getLogger(__name__)

#: progress(phase, done, total): phases "activations", "training" (done/total epochs), "evaluating".
PhaseProgress = Callable[[str, int, int], None]
ModelSource = str | Path | onnx.ModelProto | LayerGraph

_TIMING_RUNS = 50
_TIMING_WARMUP = 5


@dataclass(frozen=True)
class SplitPoint:
    """The tensor ``tensor`` that crosses the cut after unit ``unit``."""

    unit: int
    tensor: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def load_model_graph(model: ModelSource, input_shapes: Mapping[str, Sequence[int]] | None = None
                     ) -> tuple[LayerGraph, str]:
    """The model's layer graph and sha256 (of the file when given a path, else of the serialised model).

    Raises:
        CompressionError: the model cannot be loaded (the partitioner's message, chained).
    """
    if isinstance(model, LayerGraph):
        lg = model
    else:
        try:
            lg = LayerGraph.load(model, input_shapes)
        except ModelError as e:
            raise CompressionError(str(e)) from e
    if lg.source_path is not None:
        from functions.bundle import sha256_file

        return lg, sha256_file(lg.source_path)
    return lg, hashlib.sha256(lg.model.SerializeToString(deterministic=True)).hexdigest()


def conv_split_units(lg: LayerGraph) -> list[int]:
    """Units after which the cut tensor is a float32 ``[1, C, H, W]`` tensor (where an autoencoder fits)."""
    out = []
    for u in lg.units[:-1]:
        t = lg.tensors.get(u.output)
        if t is not None and len(t.shape) == 4 and t.shape[0] == 1 and t.dtype == np.float32:
            out.append(u.index)
    return out


def _ranges(units: Sequence[int]) -> str:
    if not units:
        return "none"
    spans: list[list[int]] = []
    for u in units:
        if spans and u == spans[-1][1] + 1:
            spans[-1][1] = u
        else:
            spans.append([u, u])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def split_point(lg: LayerGraph, unit: int) -> SplitPoint:
    """The split point after ``unit``, checked to take a convolutional autoencoder.

    Raises:
        CompressionError: ``unit`` is not a split point of the model (out of range, or the last unit), or
            the tensor there is not a float32 NCHW tensor with batch 1.
    """
    n = len(lg.units)
    ok = conv_split_units(lg)
    if not 0 <= unit < n - 1:
        raise CompressionError(
            f"--split-after {unit} is not a split point of {lg.name}: it has units 0-{n - 1}, so splits lie after "
            f"units 0-{n - 2}; a convolutional autoencoder fits after units {_ranges(ok)}"
        )
    name = lg.units[unit].output
    t = lg.tensors.get(name)
    if t is None:
        raise CompressionError(f"the tensor after unit {unit} ({name!r}) has no static shape")
    if unit not in ok:
        raise CompressionError(
            f"the tensor after unit {unit} ({name!r}) is {t.dtype.name}{list(t.shape)}, not a float32 4-D NCHW "
            f"tensor with batch 1; the convolutional autoencoder fits after units {_ranges(ok)} of {lg.name}"
        )
    return SplitPoint(unit, name, tuple(t.shape), t.dtype.name)


@dataclass(frozen=True)
class SplitCompression:
    """A trained autoencoder at one split point, with its measured figures.

    ``ratio`` is the ratio asked for; :attr:`achieved_ratio` (``bytes_before / bytes_after``) is at least
    that. ``cached`` says the pair and its figures came from the cache, without training.
    """

    model: str
    model_sha256: str
    split: SplitPoint
    ratio: float
    design: AEDesign
    encoder: onnx.ModelProto
    decoder: onnx.ModelProto
    fidelity: Fidelity
    lossless: tuple[LosslessResult, ...]
    encoder_ms: float
    decoder_ms: float
    train_seconds: float
    train_loss: float
    train_samples: int
    calibration: str
    cache_key: str
    cached: bool = False

    @property
    def bytes_before(self) -> int:
        return self.split.nbytes

    @property
    def code_shape(self) -> tuple[int, int, int, int]:
        d = self.design
        return (1, d.code_channels, d.code_height, d.code_width)

    @property
    def bytes_after(self) -> int:
        return self.design.code_elements * np.dtype(self.split.dtype).itemsize

    @property
    def achieved_ratio(self) -> float:
        return self.bytes_before / self.bytes_after

    @property
    def added_ms(self) -> float:
        """Encoder plus decoder compute per request (median of single-thread onnxruntime runs)."""
        return self.encoder_ms + self.decoder_ms

    def compressed_model(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """``model`` (the normalised original) with this pair inserted at the split tensor."""
        return insert_autoencoder(model, self.split.tensor, self.encoder, self.decoder)

    def to_json(self) -> dict[str, Any]:
        f = self.fidelity
        return {
            "model": self.model,
            "split_after": self.split.unit,
            "tensor": self.split.tensor,
            "ratio": self.ratio,
            "achieved_ratio": round(self.achieved_ratio, 4),
            "shape_before": list(self.split.shape),
            "shape_after": list(self.code_shape),
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "accuracy_full": f.accuracy_full,
            "accuracy_ae": f.accuracy_ae,
            "accuracy_drop": f.accuracy_drop,
            "agreement": f.agreement,
            "rel_err": f.rel_err,
            "spread_err": f.spread_err,
            "reconstruction_err": f.reconstruction_err,
            "samples": f.samples,
            "classes": f.classes,
            "added_ms": round(self.added_ms, 4),
            "encoder_ms": round(self.encoder_ms, 4),
            "decoder_ms": round(self.decoder_ms, 4),
            "train_seconds": round(self.train_seconds, 3),
            "train_samples": self.train_samples,
            "stride": self.design.stride,
            "calibration": self.calibration,
            "cached": self.cached,
            "lossless": [r.to_json() for r in self.lossless],
        }

    def _metrics(self) -> dict[str, Any]:
        return {
            "model": self.model, "model_sha256": self.model_sha256,
            "split": {"unit": self.split.unit, "tensor": self.split.tensor, "shape": list(self.split.shape),
                      "dtype": self.split.dtype},
            "ratio": self.ratio, "design": self.design.to_json(), "fidelity": self.fidelity.to_json(),
            "lossless": [r.to_json() for r in self.lossless], "encoder_ms": self.encoder_ms,
            "decoder_ms": self.decoder_ms, "train_seconds": self.train_seconds, "train_loss": self.train_loss,
            "train_samples": self.train_samples, "calibration": self.calibration,
        }

    @classmethod
    def _from_cache(cls, key: str, encoder: onnx.ModelProto, decoder: onnx.ModelProto, m: dict[str, Any]
                    ) -> SplitCompression:
        s = m["split"]
        return cls(
            model=str(m["model"]), model_sha256=str(m["model_sha256"]),
            split=SplitPoint(int(s["unit"]), str(s["tensor"]), tuple(int(d) for d in s["shape"]), str(s["dtype"])),
            ratio=float(m["ratio"]), design=AEDesign.from_json(m["design"]), encoder=encoder, decoder=decoder,
            fidelity=Fidelity.from_json(m["fidelity"]),
            lossless=tuple(LosslessResult.from_json(r) for r in m["lossless"]),
            encoder_ms=float(m["encoder_ms"]), decoder_ms=float(m["decoder_ms"]),
            train_seconds=float(m["train_seconds"]), train_loss=float(m["train_loss"]),
            train_samples=int(m["train_samples"]), calibration=str(m["calibration"]), cache_key=key, cached=True,
        )


def _median_ms(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> float:
    sess = session_for(model, 1)
    names = [o.name for o in sess.get_outputs()]
    for _ in range(_TIMING_WARMUP):
        sess.run(names, feed)
    times = []
    for _ in range(_TIMING_RUNS):
        t0 = time.perf_counter()
        sess.run(names, feed)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def prefix_model(lg: LayerGraph, tensor: str) -> onnx.ModelProto:
    """The part of ``lg``'s model that computes ``tensor`` from the model inputs (for calibration runs)."""
    return onnx.utils.Extractor(lg.model).extract_model(list(lg.inputs), [tensor])


def _prepare(model: ModelSource, unit: int, ratio: float, config: TrainConfig, calibration: CalibrationSet | None,
             input_shapes: Mapping[str, Sequence[int]] | None
             ) -> tuple[LayerGraph, str, SplitPoint, CalibrationSet, str]:
    lg, sha = load_model_graph(model, input_shapes)
    sp = split_point(lg, unit)
    design_for(sp.shape, ratio, stride=config.stride)  # fail fast, before any work, on an unreachable ratio
    calib = calibration if calibration is not None else calibration_for(lg.model, seed=config.seed)
    if list(lg.inputs) != [calib.input_name]:
        raise CompressionError(f"calibration data feeds {calib.input_name!r}, the model takes {list(lg.inputs)}")
    key = cache_key(model_sha256=sha, tensor=sp.tensor, ratio=ratio, config=config, calibration=calib.fingerprint)
    return lg, sha, sp, calib, key


def cached_split(
    model: ModelSource,
    split_after_unit: int,
    ratio: float,
    *,
    config: TrainConfig | None = None,
    calibration: CalibrationSet | None = None,
    cache: AutoencoderCache | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> SplitCompression | None:
    """What :func:`compress_split` would return from the cache, or None where it would have to train.

    Raises:
        CompressionError: as :func:`compress_split`.
    """
    config = config or TrainConfig()
    lg, _, sp, _, key = _prepare(model, split_after_unit, ratio, config, calibration, input_shapes)
    hit = (cache if cache is not None else AutoencoderCache()).load(key)
    if hit is None:
        return None
    return SplitCompression._from_cache(key, hit.encoder, hit.decoder, {**hit.metrics, "model": lg.name})


def compress_split(
    model: ModelSource,
    split_after_unit: int,
    ratio: float,
    *,
    config: TrainConfig | None = None,
    calibration: CalibrationSet | None = None,
    cache: AutoencoderCache | None = None,
    use_cache: bool = True,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    progress: PhaseProgress | None = None,
) -> SplitCompression:
    """Train (or fetch from the cache) and evaluate the autoencoder for one split point and ratio.

    Args:
        model: an ONNX path, ModelProto or LayerGraph. Its single input must be a float NCHW image unless
            ``calibration`` is given.
        split_after_unit: the split point: the tensor after this unit of the layer graph.
        ratio: compression ratio ``R = |T| / |T_e| > 1`` to reach at least.
        config: training settings (all of them part of the cache key); default :class:`TrainConfig`.
        calibration: the inputs to train and evaluate on; default: :func:`calibration_for` the model
            (real digits for ``digits-cnn``, synthetic images otherwise).
        cache: where trained pairs are kept (default: :class:`AutoencoderCache` at its default root).
        use_cache: False trains anew and does not write the cache.
        input_shapes: fixes dynamic input dimensions, as for :meth:`LayerGraph.load`.
        progress: called as phases advance (see :data:`PhaseProgress`).

    Raises:
        CompressionError: a split point or ratio that does not fit (see :func:`split_point`,
            :func:`autoencoder.design.design_for`), or unusable calibration data.
    """
    config = config or TrainConfig()
    lg, sha, sp, calib, key = _prepare(model, split_after_unit, ratio, config, calibration, input_shapes)
    store = cache if cache is not None else AutoencoderCache()
    with contextlib.ExitStack() as held:
        if use_cache:
            # another process training this autoencoder: wait for it, then take its result from the cache
            held.enter_context(exclusive(store.lock_path(key)))
            hit = store.load(key)
            if hit is not None:
                log.info("autoencoder for %s after unit %d at R=%g from the cache (%s)", lg.name, sp.unit, ratio,
                         hit.path)
                return SplitCompression._from_cache(key, hit.encoder, hit.decoder,
                                                    {**hit.metrics, "model": lg.name})

        def phase(name: str, done: int, total: int) -> None:
            if progress is not None:
                progress(name, done, total)

        # -- activations at the split, from the training split (augmented) and the held-out split (clean)
        phase("activations", 0, 1)
        from autoencoder.augment import augment_images

        rng = np.random.default_rng(config.seed)
        train = calib.train
        by_memory = config.max_activation_mb * 2**20 // (sp.nbytes * (1 + config.augment_copies))
        keep = max(1, min(config.max_train_inputs, by_memory))
        if len(train) > keep:
            train = train[np.sort(rng.choice(len(train), keep, replace=False))]
        augmented = augment_images(train, config.augment_copies, seed=config.seed, bounds=calib.bounds)
        x_train = np.concatenate([train, augmented]) if len(augmented) else train
        prefix = BatchRunner(prefix_model(lg, sp.tensor), threads=1)
        a_train = prefix.run({calib.input_name: x_train})[sp.tensor]
        a_test = prefix.run({calib.input_name: calib.test})[sp.tensor]
        phase("activations", 1, 1)

        # -- train and export
        from autoencoder.train import train_weights

        design = design_for(sp.shape, ratio, stride=config.stride, relu_out=bool(a_train.min() >= 0),
                            min_stride1_channels=config.min_stride1_channels)
        log.info("training %s at R=%g on %d activations of %s: code %s, stride %d", lg.name, ratio, len(a_train),
                 list(sp.shape), [design.code_channels, design.code_height, design.code_width], design.stride)
        weights = train_weights(design, a_train, config=config,
                                progress=lambda e, total, _loss: phase("training", e, total))
        encoder = encoder_model(design, weights, sp.tensor, host=lg.model)
        decoder = decoder_model(design, weights, sp.tensor, host=lg.model)

        # -- evaluate on held-out inputs: the real compressed model against the original
        phase("evaluating", 0, 1)
        compressed = insert_autoencoder(lg.model, sp.tensor, encoder, decoder)
        out = lg.outputs[0]
        y_full = BatchRunner(lg.model, threads=1).run({calib.input_name: calib.test}, [out])[out]
        y_ae = BatchRunner(compressed, threads=1).run({calib.input_name: calib.test}, [out])[out]
        enc_runner = BatchRunner(encoder, threads=1)
        code = enc_runner.run({sp.tensor: a_test})[enc_runner.output_names[0]]
        dec_runner = BatchRunner(decoder, threads=1)
        recon = dec_runner.run({dec_runner.input_names[0]: code})[sp.tensor]
        fidelity = measure_fidelity(y_full, y_ae, calib.test_labels, activations=a_test, reconstructed=recon)
        encoder_ms = _median_ms(encoder, {sp.tensor: a_test[:1]})
        decoder_ms = _median_ms(decoder, {dec_runner.input_names[0]: code[:1]})
        lossless = tuple(measure_lossless(a_test))
        phase("evaluating", 1, 1)

        result = SplitCompression(
            model=lg.name, model_sha256=sha, split=sp, ratio=float(ratio), design=design, encoder=encoder,
            decoder=decoder, fidelity=fidelity, lossless=lossless, encoder_ms=encoder_ms, decoder_ms=decoder_ms,
            train_seconds=weights.seconds, train_loss=weights.train_loss, train_samples=len(a_train),
            calibration=calib.name, cache_key=key,
        )
        if use_cache:
            store.store(key, encoder, decoder, result._metrics())
        return result
