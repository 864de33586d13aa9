"""The zoo's front door: build a named model as an ONNX ModelProto, or straight to a file."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import onnx

from zoo.errors import ZooError
from zoo.export import export_torch_model, save_model, tensor_bytes
from zoo.options import BuildOptions, resolve_options
from zoo.registry import TRANSFORMER_FAMILIES, ZooEntry, resolve
from zoo.torch_model import TorchModel

__all__ = [
    "PARAMETERS_KEY",
    "ZOO_KEY",
    "build",
    "build_to_file",
    "build_torch",
    "count_parameters",
    "zoo_metadata",
]

_log = logging.getLogger(__name__)

_Maker = Callable[[str, BuildOptions], TorchModel]

#: metadata_props key holding JSON ``{"name", "family", "options"}`` describing how the model was built.
ZOO_KEY = "flatpack.zoo"
#: metadata_props key holding the torch module's trainable parameter count (a decimal string).
PARAMETERS_KEY = "flatpack.parameters"

_CHECK_LIMIT_BYTES = 1_800_000_000


def build_torch(
    name: str,
    *,
    width_div: int = 1,
    input_size: int | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    nodes: int | None = None,
    seed: int = 0,
    exporter: str = "legacy",
    opset: int = 17,
    attention: str = "eager",
    dynamic_axes: bool = False,
) -> TorchModel:
    """The eval-mode torch module :func:`build` would export, with its example inputs.

    Takes exactly :func:`build`'s arguments (``exporter`` and ``opset`` are validated but unused) and
    gives the same weights for the same seed, so ONNX outputs can be compared with torch's.

    Raises:
        ZooError: as :func:`build`.
    """
    requested = BuildOptions(
        width_div=width_div, input_size=input_size, layers=layers, hidden=hidden, heads=heads,
        seq_len=seq_len, vocab=vocab, nodes=nodes, seed=seed, exporter=exporter, opset=opset,
        attention=attention, dynamic_axes=dynamic_axes,
    )  # fmt: skip
    entry, make, options = _resolve(name, requested)
    return make(entry.name, options)


def _resolve(name: str, requested: BuildOptions) -> tuple[ZooEntry, _Maker, BuildOptions]:
    entry, make = resolve(name)
    if entry.family == "lstm" and requested.layers is not None:
        raise ZooError(
            f"{entry.name} takes its layer count from its name, not from layers={requested.layers}; "
            f"build lstm-{requested.layers} instead"
        )
    transformer = entry.family in TRANSFORMER_FAMILIES
    return entry, make, resolve_options(entry.name, requested, dict(entry.defaults), transformer=transformer)


def build(
    name: str,
    *,
    width_div: int = 1,
    input_size: int | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    nodes: int | None = None,
    seed: int = 0,
    exporter: str = "legacy",
    opset: int = 17,
    attention: str = "eager",
    dynamic_axes: bool = False,
) -> onnx.ModelProto:
    """Build zoo model ``name`` with random (or, for ``digits-cnn``, trained) weights and export it to ONNX.

    Nothing is downloaded. The same name, options and seed give byte-identical initializers. Batch size is
    1 and every shape is static, unless ``dynamic_axes``.

    Args:
        name: a name from :func:`zoo.list_models`, or any ``wrn-34-K``/``wrn-50-K``/``lstm-N``.
        width_div: divide every channel/feature width by this (at least 1 channel) for small variants.
        input_size: image side (vgg: a multiple of 32; resnet/wrn, mobilenetv3, efficientnet >= 32; mobilenet
            >= 16; vit >= 16, cropped to a multiple of 16; digits >= 8).
        layers: bert/vit encoder layers or gcn layers.
        hidden: bert/vit/lstm hidden size, gcn hidden width.
        heads: bert/vit attention heads (must divide the hidden size).
        seq_len: bert/lstm sequence length.
        vocab: bert vocabulary size.
        nodes: gcn node count.
        seed: fixes weights, BN statistics, the gcn graph and the digits split.
        exporter: ``"legacy"`` (``torch.onnx.export(dynamo=False)``) or ``"dynamo"`` (``dynamo=True``,
            ``optimize=True``).
        opset: ONNX opset to export at (13..23).
        attention: bert/vit attention: ``"eager"`` (MatMul, Softmax, MatMul written out) or ``"sdpa"``
            (``torch.nn.functional.scaled_dot_product_attention``, decomposed by the exporter).
        dynamic_axes: bert/vit only: export with symbolic ``batch`` (and bert's ``seq``) axes, the way
            people export transformers (sizes from ``tensor.shape``); the partitioner needs them fixed.

    Size options a model does not take must stay ``None``; see ``ZooEntry.options``.

    Returns:
        A checked, self-contained ModelProto (no external data) with graph inputs ``input`` (bert:
        ``input_ids``, ``attention_mask``, ``token_type_ids``) and output ``output``, ``doc_string`` set to the model's
        description and ``metadata_props`` holding :data:`ZOO_KEY`, :data:`PARAMETERS_KEY` and, for
        ``digits-cnn``, its test accuracy and split seed. A model over about 2 GB cannot be serialised
        in one piece; write it with :func:`build_to_file`.

    Raises:
        ZooError: unknown name, an option the model does not take, or an invalid value.
        ZooExportError: the exporter failed.
    """
    requested = BuildOptions(
        width_div=width_div, input_size=input_size, layers=layers, hidden=hidden, heads=heads,
        seq_len=seq_len, vocab=vocab, nodes=nodes, seed=seed, exporter=exporter, opset=opset,
        attention=attention, dynamic_axes=dynamic_axes,
    )  # fmt: skip
    entry, make, options = _resolve(name, requested)
    start = time.perf_counter()
    tm = make(entry.name, options)
    built = time.perf_counter()
    model = export_torch_model(tm, exporter=options.exporter, opset=options.opset, label=entry.name)
    _log.info(
        "built %s in %.1f s, exported with %s in %.1f s",
        entry.name,
        built - start,
        options.exporter,
        time.perf_counter() - built,
    )
    model.doc_string = f"flatpack zoo {entry.name}: {entry.description}"
    metadata = {
        ZOO_KEY: json.dumps({"name": entry.name, "family": entry.family, "options": options.as_dict()}, sort_keys=True),
        PARAMETERS_KEY: str(tm.parameter_count),
        **dict(tm.metadata),
    }
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, **metadata})
    if tensor_bytes(model) < _CHECK_LIMIT_BYTES:
        onnx.checker.check_model(model)
    return model


def build_to_file(
    name: str,
    path: str | Path,
    *,
    width_div: int = 1,
    input_size: int | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    nodes: int | None = None,
    seed: int = 0,
    exporter: str = "legacy",
    opset: int = 17,
    attention: str = "eager",
    dynamic_axes: bool = False,
) -> Path:
    """:func:`build` ``name`` with the same options and save it to ``path``; returns the path.

    Parent directories are created. Above 1.8 GB of weights the tensors go to ``<path name>.data`` next to
    the model (ONNX external data); below, the file is self-contained.

    Raises:
        ZooError, ZooExportError: as :func:`build`.
    """
    model = build(
        name, width_div=width_div, input_size=input_size, layers=layers, hidden=hidden, heads=heads,
        seq_len=seq_len, vocab=vocab, nodes=nodes, seed=seed, exporter=exporter, opset=opset,
        attention=attention, dynamic_axes=dynamic_axes,
    )  # fmt: skip
    return save_model(model, path)


def count_parameters(model: onnx.ModelProto) -> int:
    """The parameter count recorded at build time, or else the element count of the float initializers."""
    for prop in model.metadata_props:
        if prop.key == PARAMETERS_KEY:
            return int(prop.value)
    floats = {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.DOUBLE,
    }
    total = 0
    for t in model.graph.initializer:
        if t.data_type in floats:
            count = 1
            for d in t.dims:
                count *= d
            total += count
    return total


def zoo_metadata(model: onnx.ModelProto) -> dict[str, str]:
    """All ``metadata_props`` of a model as a dict (``flatpack.*`` keys and any others)."""
    return {p.key: p.value for p in model.metadata_props}
