"""torch -> ONNX for zoo models, with either exporter, quietly, and saving above the protobuf limit.

Both exporters write to a scratch directory and the result is loaded back with its weights, so callers
always get one self-contained :class:`onnx.ModelProto`. Models whose tensors exceed
:data:`EXTERNAL_DATA_THRESHOLD_BYTES` can still be built and held in memory, but only
:func:`save_model` (external data) can write them: protobuf cannot serialise a message over 2 GB. Both are
the partitioner's (:mod:`partitioner.model_file`), re-exported here: flatpack writes every model the same way.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx.version_converter
import torch

from partitioner.model_file import EXTERNAL_DATA_THRESHOLD_BYTES, save_model
from zoo.errors import ZooExportError
from zoo.torch_model import TorchModel

__all__ = ["EXTERNAL_DATA_THRESHOLD_BYTES", "export_torch_model", "save_model", "tensor_bytes"]

_log = logging.getLogger(__name__)


# Loggers the exporters chat on; silenced to ERROR while exporting.
_NOISY_LOGGERS = (
    "torch.onnx",
    "torch.export",
    "torch._export",
    "torch._dynamo",
    "torch.fx",
    "torch._subclasses",
    "torch._functorch",
    "torch.utils._sympy",
    "onnxscript",
    "onnx_ir",
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # The dynamo exporter prints progress with print() and both exporters warn about things that are
    # expected here (deprecation of the legacy path, opset down-conversion); keep the CLI's console clean
    # but keep the chatter available at DEBUG.
    saved = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    captured = io.StringIO()
    try:
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(captured),
            contextlib.redirect_stderr(captured),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
        if captured.getvalue().strip():
            _log.debug("exporter output:\n%s", captured.getvalue().rstrip())


_DYNAMO_MIN_OPSET = 18
# torch.export's default upper bound for a symbolic size is "unbounded" spelled as a large int.
_UNBOUNDED_DIM = 1 << 20


def _export_legacy(tm: TorchModel, path: Path, opset: int) -> None:
    torch.onnx.export(
        tm.module,
        tm.example_inputs,
        str(path),
        dynamo=False,
        input_names=list(tm.input_names),
        output_names=list(tm.output_names),
        opset_version=opset,
        do_constant_folding=True,
        dynamic_axes={name: dict(axes) for name, axes in tm.dynamic_axes.items()} or None,
    )


def _dynamic_shapes(tm: TorchModel) -> tuple[dict[int, Any], ...] | None:
    """torch.export's form of ``tm.dynamic_axes``: one ``Dim`` per dimension name, shared by the inputs."""
    if not tm.dynamic_axes:
        return None
    dims: dict[str, Any] = {}
    shapes = []
    for name in tm.input_names:
        axes = {}
        for axis, dim in tm.dynamic_axes.get(name, {}).items():
            if dim not in dims:
                dims[dim] = torch.export.Dim(dim, min=1, max=tm.dynamic_max.get(dim, _UNBOUNDED_DIM))
            axes[axis] = dims[dim]
        shapes.append(axes)
    return tuple(shapes)


def _export_dynamo(tm: TorchModel, path: Path, opset: int) -> None:
    program = torch.onnx.export(
        tm.module,
        tm.example_inputs,
        dynamo=True,
        optimize=True,
        verbose=False,
        report=False,
        input_names=list(tm.input_names),
        output_names=list(tm.output_names),
        dynamic_shapes=_dynamic_shapes(tm),
        # Below its minimum the exporter would try its own down-conversion, which gives up on graphs
        # onnx's converter handles; export at 18 and let _convert_opset do it once.
        opset_version=max(opset, _DYNAMO_MIN_OPSET),
    )
    if program is None:  # only when a destination is given, which it is not here
        raise RuntimeError("torch.onnx.export(dynamo=True) returned no program")
    program.save(str(path))


def export_torch_model(tm: TorchModel, *, exporter: str, opset: int, label: str) -> onnx.ModelProto:
    """Export ``tm`` and return the model with every weight inside the proto.

    Shapes are static unless ``tm`` names dynamic axes (both exporters then make those axes symbolic).

    Args:
        tm: the module, example inputs and names.
        exporter: ``"legacy"`` (TorchScript, ``dynamo=False``, constant folding on) or ``"dynamo"``
            (torch.export, ``optimize=True`` so constants are folded and the graph is cleaned up).
        opset: requested ONNX opset. The dynamo exporter translates at opset 18 or newer and the result is
            converted down with onnx's version converter (opset 17 works for every zoo model; older
            opsets mostly lack adapters and raise).
        label: the zoo name, for error messages.

    Raises:
        ZooExportError: the exporter or the opset conversion failed; the original exception is chained.
    """
    with tempfile.TemporaryDirectory(prefix="flatpack-zoo-") as tmp:
        path = Path(tmp) / "model.onnx"
        try:
            with _quiet(), torch.no_grad():
                if exporter == "legacy":
                    _export_legacy(tm, path, opset)
                else:
                    _export_dynamo(tm, path, opset)
        except Exception as exc:
            other = "dynamo" if exporter == "legacy" else "legacy"
            raise ZooExportError(
                f"exporting {label} with the {exporter} exporter at opset {opset} failed: "
                f"{type(exc).__name__}: {exc}; try exporter={other!r} or another opset"
            ) from exc
        model = onnx.load(str(path), load_external_data=False)
        if exporter == "dynamo":
            model = _convert_opset(model, opset, label, Path(tmp))
        onnx.load_external_data_for_model(model, tmp)
    _drop_initializer_identities(model)
    return model


def _convert_opset(model: onnx.ModelProto, opset: int, label: str, base_dir: Path) -> onnx.ModelProto:
    # Big models' weights are still external here (in base_dir), so this works over 2 GB too; the checker
    # then needs the model on disk next to its data.
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), opset)
    if current == opset:
        return model
    try:
        converted = onnx.version_converter.convert_version(model, opset)
        if opset < _REDUCE_AXES_INPUT_OPSET:
            _strip_noop_with_empty_axes(converted)
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in converted.graph.initializer):
            checked = base_dir / "converted.onnx"
            onnx.save_model(converted, str(checked))
            onnx.checker.check_model(str(checked))
        else:
            onnx.checker.check_model(converted)
    except Exception as exc:
        raise ZooExportError(
            f"{label}: the dynamo exporter produced opset {current} and converting it to opset {opset} "
            f"failed ({type(exc).__name__}: {str(exc).strip().splitlines()[-1]}); "
            f"use opset={current} or exporter='legacy'"
        ) from exc
    return converted


_REDUCE_AXES_INPUT_OPSET = 18


def _strip_noop_with_empty_axes(model: onnx.ModelProto) -> None:
    # onnx's 18 -> 17 adapter moves Reduce* axes back to an attribute but keeps noop_with_empty_axes,
    # which only ReduceSum has before opset 18. Its default (0) means what those ops do at 17, so drop it.
    for node in model.graph.node:
        if not node.op_type.startswith("Reduce") or node.op_type == "ReduceSum":
            continue
        kept = [a for a in node.attribute if not (a.name == "noop_with_empty_axes" and a.i == 0)]
        if len(kept) != len(node.attribute):
            del node.attribute[:]
            node.attribute.extend(kept)


def _drop_initializer_identities(model: onnx.ModelProto) -> None:
    # The legacy exporter de-duplicates equal initializers (zero LSTM states, say) and feeds the copies
    # through Identity nodes. Consumers can share one initializer directly; keep the graph free of them.
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    alias = {
        n.output[0]: n.input[0]
        for n in graph.node
        if n.op_type == "Identity" and n.input[0] in initializers and n.output[0] not in outputs
    }
    if not alias:
        return
    kept = [n for n in graph.node if not (n.op_type == "Identity" and n.output and n.output[0] in alias)]
    for node in kept:
        for i, name in enumerate(node.input):
            if name in alias:
                node.input[i] = alias[name]
    del graph.node[:]
    graph.node.extend(kept)
    dropped = set(alias)
    kept_info = [v for v in graph.value_info if v.name not in dropped]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)


def tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of tensor data in the graph's initializers and Constant nodes, from their dims and dtypes.

    Computed from shapes, not by touching ``raw_data`` (copying 1 GB of bytes just to measure it is slow).
    String tensors count as zero.
    """
    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        tensors += [a.t for a in node.attribute if a.type == onnx.AttributeProto.TENSOR]
    total = 0
    for t in tensors:
        if t.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
            continue
        count = 1
        for d in t.dims:
            count *= d
        total += count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total
