"""Per-edge compression options for the planner: what each choice costs in time and buys in bytes.

The planner asks :func:`edge_options` about one split point and gets every option the user's
``--compress`` allows, each with its bytes on the wire, the compute it adds per request and its accuracy
cost, and chooses among them under ``--max-accuracy-drop``. Raw transfer is always an option.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from autoencoder.cache import AutoencoderCache
from autoencoder.compress import (
    ModelSource,
    PhaseProgress,
    SplitCompression,
    cached_split,
    compress_split,
    load_model_graph,
    prefix_model,
)
from autoencoder.config import TrainConfig
from autoencoder.datasets import CalibrationSet, calibration_for
from autoencoder.errors import CompressionError
from autoencoder.lossless import WIRE_CODECS, LosslessResult, measure_lossless
from autoencoder.runner import BatchRunner
from autoencoder.spec import CompressSpec, parse_compress
from partitioner.graph import LayerGraph

__all__ = ["EdgeKind", "EdgeOption", "edge_options"]

log = logging.getLogger(__name__)

EdgeKind = Literal["none", "lossless", "ae"]

_LOSSLESS_SAMPLES = 16


@dataclass(frozen=True)
class EdgeOption:
    """One way to send the tensor across a split point.

    Attributes:
        kind: ``none`` (raw), ``lossless`` (a codec of :mod:`functions.codec`), ``ae`` (an autoencoder
            baked into the two parts).
        codec: ``raw``, ``zstd``, ``lz4`` or ``ae``.
        ratio: ``bytes_before / bytes_after`` as measured (lossless: mean over real tensors).
        bytes_before, bytes_after: per request, payload only (the codec header is 64 bytes more).
        added_ms: compute added per request: compress + decompress for codecs, encoder + decoder for
            autoencoders (single-thread onnxruntime), 0 for raw.
        accuracy_drop: 0 for raw and lossless; for autoencoders the measured top-1 accuracy drop on held-out
            labelled data, or the top-1 disagreement with the uncompressed model where there are no labels
            (an upper bound on the drop).
        requested_ratio: the ratio the autoencoder was trained for (``ae`` only).
        cache_key: where the trained autoencoder is cached (``ae`` only).
        encode_ms, decode_ms: ``added_ms`` by side: the sender's compress or encoder, the receiver's
            decompress or decoder.
    """

    kind: EdgeKind
    codec: str
    ratio: float
    bytes_before: int
    bytes_after: float
    added_ms: float
    accuracy_drop: float
    requested_ratio: float | None = None
    cache_key: str | None = None
    encode_ms: float = 0.0
    decode_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _lossless_option(r: LosslessResult) -> EdgeOption:
    return EdgeOption("lossless", r.codec, r.ratio, r.bytes_before, r.bytes_after,
                      r.compress_ms + r.decompress_ms, 0.0, encode_ms=r.compress_ms, decode_ms=r.decompress_ms)


def _ae_option(sc: SplitCompression) -> EdgeOption:
    return EdgeOption("ae", "ae", sc.achieved_ratio, sc.bytes_before, float(sc.bytes_after), sc.added_ms,
                      max(0.0, sc.fidelity.accuracy_drop), sc.ratio, sc.cache_key, sc.encoder_ms, sc.decoder_ms)


def _split_activations(lg: LayerGraph, tensor: str, calibration: CalibrationSet | None, seed: int) -> np.ndarray:
    """Real tensors at the split: from held-out calibration inputs, else from random inputs."""
    prefix = BatchRunner(prefix_model(lg, tensor), threads=1)
    if calibration is None:
        try:
            calibration = calibration_for(lg.model, seed=seed)
        except CompressionError:
            from partitioner.inputs import random_inputs

            feeds = [random_inputs(lg.model, seed + i) for i in range(_LOSSLESS_SAMPLES)]
            stacked = {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}
            return prefix.run(stacked, [tensor])[tensor]
    return prefix.run({calibration.input_name: calibration.test[:_LOSSLESS_SAMPLES]}, [tensor])[tensor]


def edge_options(
    model: ModelSource,
    split_after_unit: int,
    *,
    compress: CompressSpec | str = "ae",
    max_accuracy_drop: float | None = None,
    train: bool = True,
    config: TrainConfig | None = None,
    calibration: CalibrationSet | None = None,
    cache: AutoencoderCache | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    progress: PhaseProgress | None = None,
) -> list[EdgeOption]:
    """The options for the tensor after unit ``split_after_unit``, raw first, then by bytes after.

    Args:
        model: an ONNX path, ModelProto or LayerGraph.
        split_after_unit: the split point (a cut after this unit; not the last unit).
        compress: the user's ``--compress``: ``none`` gives raw only, ``lossless`` adds the wire codecs
            (zstd level 1, lz4), ``ae`` / ``ae:R`` adds autoencoders at those ratios.
        max_accuracy_drop: leave out autoencoders whose accuracy drop exceeds this fraction (0.005 = 0.5 pp).
        train: False returns only autoencoders already in the cache (cheap, for repeated planning); True
            trains the missing ones (seconds to minutes each).
        config, calibration, cache, input_shapes, progress: as :func:`autoencoder.compress_split`.

    Autoencoders are left out, with a log message, where the split tensor is not 4-D NCHW or a ratio is
    out of reach for it; raw and lossless options exist at every split point.

    Raises:
        CompressionError: ``split_after_unit`` is not a split point of the model.
        ValueError: a malformed ``compress`` string.
    """
    spec = parse_compress(compress) if isinstance(compress, str) else compress
    config = config or TrainConfig()
    lg, _ = load_model_graph(model, input_shapes)
    n = len(lg.units)
    if not 0 <= split_after_unit < n - 1:
        raise CompressionError(f"split after unit {split_after_unit} is not a split point: the model has units "
                               f"0-{n - 1}, so splits lie after units 0-{n - 2}")
    tensor = lg.units[split_after_unit].output
    nbytes = lg.tensors[tensor].nbytes
    options = [EdgeOption("none", "raw", 1.0, nbytes, float(nbytes), 0.0, 0.0)]
    if spec.kind == "none":
        return options
    lossless: list[LosslessResult] | None = None
    if spec.kind == "ae":
        for ratio in spec.ratios:
            try:
                sc = _ae(lg, split_after_unit, ratio, train=train, config=config, calibration=calibration,
                         cache=cache, progress=progress)
            except CompressionError as e:
                log.info("no autoencoder option at R=%g after unit %d: %s", ratio, split_after_unit, e)
                continue
            if sc is None:
                continue
            lossless = lossless or list(sc.lossless)
            opt = _ae_option(sc)
            if max_accuracy_drop is not None and opt.accuracy_drop > max_accuracy_drop:
                log.info("autoencoder R=%g after unit %d drops accuracy by %.4f > %.4f; left out", ratio,
                         split_after_unit, opt.accuracy_drop, max_accuracy_drop)
                continue
            options.append(opt)
    if lossless is None:
        lossless = measure_lossless(_split_activations(lg, tensor, calibration, config.seed), codecs=WIRE_CODECS)
    options.extend(_lossless_option(r) for r in lossless if r.wire)
    return [options[0], *sorted(options[1:], key=lambda o: o.bytes_after)]


def _ae(lg: LayerGraph, unit: int, ratio: float, *, train: bool, config: TrainConfig,
        calibration: CalibrationSet | None, cache: AutoencoderCache | None, progress: PhaseProgress | None
        ) -> SplitCompression | None:
    if not train:
        return cached_split(lg, unit, ratio, config=config, calibration=calibration, cache=cache)
    return compress_split(lg, unit, ratio, config=config, calibration=calibration, cache=cache, progress=progress)
