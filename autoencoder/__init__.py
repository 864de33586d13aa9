"""MOPAR's split-point compression (section II-D): a one-conv encoder in the producing part, a one-conv
decoder in the consuming part, trained on augmented calibration data; plus lossless codecs, and the
per-edge options a planner chooses among.

    >>> from autoencoder import compress_split, compress_bundle, edge_options
    >>> sc = compress_split("digits.onnx", split_after_unit=1, ratio=4)
    >>> sc.bytes_before / sc.bytes_after, sc.fidelity.accuracy_drop
    >>> compress_bundle("digits.onnx", 1, 4, "build/digits-ae4")        # a verified two-stage bundle
    >>> edge_options("digits.onnx", 1, compress="ae:4", max_accuracy_drop=0.005)
    >>> codecs, why = PlanCodecs.for_model(lg, AutoencoderOptions(parse_compress("ae:4")))  # for --mode mopar
"""

from autoencoder.augment import Augmentation, augment_images
from autoencoder.bundle import (
    ORIGINAL_FILE,
    Placement,
    compress_bundle,
    uncompressed_bundle,
    write_coded_bundle,
    write_compressed_bundle,
)
from autoencoder.cache import CACHE_FORMAT, AutoencoderCache, CacheEntry, cache_key
from autoencoder.compress import (
    ModelSource,
    PhaseProgress,
    SplitCompression,
    SplitPoint,
    cached_split,
    compress_split,
    conv_split_units,
    load_model_graph,
    prefix_model,
    split_point,
)
from autoencoder.config import TrainConfig
from autoencoder.datasets import (
    CalibrationSet,
    calibration_for,
    image_input,
    load_calibration,
    shipped_calibration,
    synthetic_images,
)
from autoencoder.design import AEDesign, design_for
from autoencoder.edge import EdgeKind, EdgeOption, edge_options
from autoencoder.errors import CompressionError
from autoencoder.export import CODE_SUFFIX, code_name, decoder_model, encoder_model
from autoencoder.fidelity import Fidelity, measure_fidelity
from autoencoder.lossless import DEFAULT_CODECS, WIRE_CODECS, LosslessResult, measure_lossless
from autoencoder.plan_codecs import AutoencoderOptions, PlanCodecs, export_planned, with_autoencoders
from autoencoder.runner import BatchRunner
from autoencoder.spec import (
    DEFAULT_AE_RATIOS,
    DEFAULT_MAX_ACCURACY_DROP,
    CompressKind,
    CompressSpec,
    parse_accuracy_drop,
    parse_compress,
)
from autoencoder.splice import DECODED_SUFFIX, attach_decoder, attach_encoder, insert_autoencoder
from autoencoder.train import TrainedWeights, train_weights

__all__ = [
    "CACHE_FORMAT",
    "CODE_SUFFIX",
    "DECODED_SUFFIX",
    "DEFAULT_AE_RATIOS",
    "DEFAULT_CODECS",
    "DEFAULT_MAX_ACCURACY_DROP",
    "ORIGINAL_FILE",
    "WIRE_CODECS",
    "AEDesign",
    "Augmentation",
    "AutoencoderOptions",
    "AutoencoderCache",
    "BatchRunner",
    "CacheEntry",
    "CalibrationSet",
    "CompressKind",
    "CompressSpec",
    "CompressionError",
    "EdgeKind",
    "EdgeOption",
    "Fidelity",
    "LosslessResult",
    "ModelSource",
    "PhaseProgress",
    "Placement",
    "PlanCodecs",
    "SplitCompression",
    "SplitPoint",
    "TrainConfig",
    "TrainedWeights",
    "attach_decoder",
    "attach_encoder",
    "augment_images",
    "cache_key",
    "cached_split",
    "calibration_for",
    "code_name",
    "compress_bundle",
    "compress_split",
    "conv_split_units",
    "decoder_model",
    "design_for",
    "edge_options",
    "encoder_model",
    "export_planned",
    "image_input",
    "insert_autoencoder",
    "load_calibration",
    "load_model_graph",
    "measure_fidelity",
    "measure_lossless",
    "parse_accuracy_drop",
    "parse_compress",
    "prefix_model",
    "shipped_calibration",
    "split_point",
    "synthetic_images",
    "train_weights",
    "uncompressed_bundle",
    "with_autoencoders",
    "write_coded_bundle",
    "write_compressed_bundle",
]
