"""Writing ONNX models to files: one ``save_model`` for every model flatpack writes (zoo models, bundle
parts, normalised sources, profiled units).

Protobuf cannot serialise a message over 2 GB, so a large model's tensors go to an external data file
beside it. :func:`onnx.save_model` does that by moving the weights out of the proto it is given; this
module never lets that reach the caller (the loaded LayerGraph of a big model must keep its weights,
whatever happens to the file written from it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import EncodeError
from onnx import external_data_helper

__all__ = ["EXTERNAL_DATA_THRESHOLD_BYTES", "PROTOBUF_LIMIT_BYTES", "raw_bytes", "save_model", "serialized_bytes",
           "tensor_nbytes"]

#: Above this serialised size a model's tensors go to ``<file name>.data`` (protobuf's limit is 2 GB).
EXTERNAL_DATA_THRESHOLD_BYTES = 1_800_000_000
#: The largest message protobuf serialises.
PROTOBUF_LIMIT_BYTES = 2**31


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    """The bytes of ``tensor``'s values: its elements times their width, without reading them (protobuf's
    ``ByteSize`` serialises a tensor to measure it: seconds for a gigabyte); a string tensor's serialised size."""
    if tensor.data_type == onnx.TensorProto.STRING:
        return int(tensor.ByteSize())
    width = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return math.prod(tensor.dims) * width


def raw_bytes(model: onnx.ModelProto) -> int:
    """The bytes of ``model``'s tensors held as ``raw_data`` (a model's weights, as exporters write them): a
    lower bound of its serialised size, counted without serialising it."""
    return sum(tensor_nbytes(t) for t in _tensors(model.graph)
               if t.HasField("raw_data") and not external_data_helper.uses_external_data(t))


def serialized_bytes(model: onnx.ModelProto) -> int:
    """``model``'s serialised size, or :data:`PROTOBUF_LIMIT_BYTES` where it is larger (protobuf then cannot
    even measure it: ``ByteSize`` raises). A model whose raw tensors alone reach the limit is not serialised
    to say so: ``ByteSize`` serialises it, some 5 s for 2 GB."""
    if raw_bytes(model) >= PROTOBUF_LIMIT_BYTES:
        return PROTOBUF_LIMIT_BYTES
    try:
        return min(model.ByteSize(), PROTOBUF_LIMIT_BYTES)
    except EncodeError:
        return PROTOBUF_LIMIT_BYTES


def save_model(model: onnx.ModelProto, path: str | Path, *, threshold_bytes: int | None = None) -> Path:
    """Save ``model`` to ``path`` (parent directories created); returns the path.

    Above ``threshold_bytes`` (default :data:`EXTERNAL_DATA_THRESHOLD_BYTES`) of serialised size, every
    tensor of 1 KB or more goes to ``<path name>.data`` next to the model (an existing one is replaced).
    ``model`` is the same when this returns, or raises, as when it was called: onnx moves the weights to
    the file, and they are put back from it. That costs one read of the data file instead of a copy of
    the whole model in memory (the models that need external data are the ones a copy would hurt). Do not
    read ``model`` from another thread during the call.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    limit = EXTERNAL_DATA_THRESHOLD_BYTES if threshold_bytes is None else threshold_bytes
    if raw_bytes(model) <= limit and serialized_bytes(model) <= limit:
        onnx.save_model(model, str(path))
        return path
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    had_location = [t.HasField("data_location") for t in _tensors(model.graph)]
    try:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024)
    finally:
        _restore_weights(model, path.parent, had_location)
    return path


def _restore_weights(model: onnx.ModelProto, base_dir: Path, had_location: list[bool]) -> None:
    """Undo what saving with external data did to ``model``: weights written to the file are read back
    (a failed save may have written only some), the others lose their external-data marks, and each
    tensor's ``data_location`` is set or unset as it was (a set field serialises even at its default)."""
    for tensor, had in zip(_tensors(model.graph), had_location, strict=True):
        if external_data_helper.uses_external_data(tensor):
            if tensor.HasField("raw_data"):  # marked, not written yet
                del tensor.external_data[:]
            else:
                external_data_helper.load_external_data_for_tensor(tensor, str(base_dir))
            tensor.data_location = onnx.TensorProto.DEFAULT
        if not had:
            tensor.ClearField("data_location")


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of ``graph`` and its subgraphs: initializers and tensor-valued attributes."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)
