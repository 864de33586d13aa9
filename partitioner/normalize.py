"""Load an ONNX model and bring it into the form the partitioner works on.

The result is a new ModelProto (the caller's model is never touched) with:
- initializers no longer listed among the graph inputs (IR < 4 style),
- Constant nodes turned into initializers,
- every dynamic input dimension fixed: a whole input's shape from ``input_shapes``, a symbolic dimension
  (``seq``) from ``dims`` in every input that names it, a leading batch axis left dynamic defaults to 1,
- shape-only and constant-only subgraphs folded into initializers, repeatedly with shape inference in
  between until nothing more folds (a fixpoint: a Shape is only foldable once the Reshape before it has
  a constant target and its output a static shape, which only the next inference gives),
- a static shape and dtype known for every tensor.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper, shape_inference

from partitioner.errors import ModelError

__all__ = [
    "DIMS_METADATA_KEY",
    "MAX_FOLD_ROUNDS",
    "MIN_OPSET",
    "ShapeFixes",
    "fixed_dims",
    "load_model",
    "normalize_model",
    "outer_scope_inputs",
    "parse_dims",
    "parse_input_shapes",
]

log = logging.getLogger(__name__)

MIN_OPSET = 11
# Never folded: (de)quantisation of constant weights stays in the graph, so that onnxruntime fuses it with
# the op it wraps (DequantizeLinear -> Conv -> QuantizeLinear runs as an integer QLinearConv) in the parts
# as in the model; control flow reads tensors of the enclosing graph that a lone node does not have.
_NEVER_FOLD = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "If", "Loop", "Scan"})
# Folding a node whose output would exceed this many elements is skipped: folding is for shape
# arithmetic and small constant transforms, not for materialising big tensors.
_FOLD_MAX_ELEMENTS = 1 << 24
#: Rounds of (fold constants, infer shapes) before normalisation gives up. Each round that changes
#: anything folds at least one node; the transformer exports tried (legacy and dynamo, dynamic axes)
#: settle in one to three.
MAX_FOLD_ROUNDS = 32
#: The normalised model's metadata key that records its fixed symbolic dimensions (see :func:`fixed_dims`).
DIMS_METADATA_KEY = "flatpack.dims"


@dataclass(frozen=True)
class ShapeFixes:
    """How a model's dynamic input dimensions are fixed: whole shapes by input name (``--input-shape``) and
    symbolic dimensions by name (``--dim``), as :func:`load_model` and ``LayerGraph.load`` take them."""

    inputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, input_shapes: Sequence[str] = (), dims: Sequence[str] = ()) -> ShapeFixes:
        """From the CLI's strings (``input_ids=1x128``, ``seq=128``); ModelError names a malformed one."""
        return cls(parse_input_shapes(input_shapes), parse_dims(dims))

    def __bool__(self) -> bool:
        """Whether anything is fixed at all."""
        return bool(self.inputs or self.dims)


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``name=1x3x224x224`` strings (the CLI's ``--input-shape``).

    An input may also be named by its position (``0=1x3x224x224``), or not named at all
    (``1x3x224x224``: the first such spec fixes input 0, the next input 1, ...); both are keyed by the
    position's digits, which :func:`normalize_model` resolves against the model's inputs (a name wins)."""
    out: dict[str, tuple[int, ...]] = {}
    unnamed = 0
    for spec in specs:
        name, sep, dims = spec.partition("=")
        if not sep:
            name, dims = str(unnamed), spec
            unnamed += 1
        try:
            if not name.strip():
                raise ValueError
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise ModelError(f"bad --input-shape {spec!r}; write it as NAME=1x3x224x224 (NAME: the input's "
                             "name or position)") from None
        if any(d < 1 for d in shape):
            raise ModelError(f"bad --input-shape {spec!r}: every dimension is at least 1")
        out[name.strip()] = shape
    return out


def parse_dims(specs: Sequence[str]) -> dict[str, int]:
    """Parse ``seq=128`` strings (the CLI's ``--dim``): a symbolic dimension's name and its value."""
    out: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        name = name.strip()
        try:
            if not sep or not name:
                raise ValueError
            size = int(value)
        except ValueError:
            raise ModelError(f"bad --dim {spec!r}; write it as NAME=SIZE, e.g. --dim seq=128") from None
        if size < 1:
            raise ModelError(f"bad --dim {spec!r}: a dimension is at least 1")
        if out.get(name, size) != size:
            raise ModelError(f"--dim {name} is given twice, as {out[name]} and {size}; give it once")
        out[name] = size
    return out


def load_model(
    source: str | Path | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> onnx.ModelProto:
    """Load ``source`` (a path or a ModelProto) and return it normalised (see the module docstring)."""
    if isinstance(source, onnx.ModelProto):
        model = copy.deepcopy(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise ModelError(f"{path}: no such file")
        try:
            model = onnx.load(str(path), load_external_data=True)
        except DecodeError as e:
            raise ModelError(f"{path} is not a valid ONNX file (truncated or not ONNX?): {e}") from e
        except (OSError, ValueError) as e:
            raise ModelError(f"{path} could not be loaded: {e}") from e
    try:
        return normalize_model(model, input_shapes, dims, _inplace=True)
    except UnicodeDecodeError as e:  # protobuf decodes string fields lazily: a corrupt name surfaces here
        where = "the model" if isinstance(source, onnx.ModelProto) else str(source)
        raise ModelError(f"{where}: a name or string in it is not valid UTF-8 ({e.reason}); the file is "
                         "corrupt") from e


def normalize_model(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    *,
    _inplace: bool = False,
) -> onnx.ModelProto:
    """``model`` in the form the partitioner works on (see the module docstring).

    Args:
        model: the model; copied unless ``_inplace``.
        input_shapes: input name -> its whole static shape (``--input-shape``).
        dims: symbolic dimension name -> size (``--dim``), applied to every input that names it.

    Raises:
        ModelError: the model cannot be brought into that form; every unfixed input dimension and
            unknown name is listed in the one error, with the ``--dim`` or ``--input-shape`` that fixes it.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected onnx.ModelProto, got {type(model).__name__}")
    if not _inplace:
        model = copy.deepcopy(model)
    opset = _default_opset(model)
    if opset < MIN_OPSET:
        raise ModelError(
            f"model uses opset {opset}; flatpack needs opset {MIN_OPSET} or newer "
            "(convert with onnx.version_converter.convert_version(model, 17))"
        )
    if len(model.graph.node) == 0:
        raise ModelError("model graph has no nodes")
    source = _light_copy(model)
    g = model.graph
    init_names = {t.name for t in g.initializer}
    real_inputs = [i for i in g.input if i.name not in init_names]
    del g.input[:]
    g.input.extend(real_inputs)
    _constants_to_initializers(g)
    resolved = _fix_input_shapes(g, dict(input_shapes or {}), dict(dims or {}))
    _record_dims(model, resolved)
    model = _infer(model)  # first, so that outputs declared without a shape get one before the checker
    try:
        onnx.checker.check_model(_light_copy(model))
    except (onnx.checker.ValidationError, ValueError) as e:  # ValueError: e.g. a name that is not UTF-8
        raise ModelError(f"model fails the ONNX checker: {_first_line(e)}") from e
    model = _fold_to_fixpoint(model)
    _require_static_shapes(model)
    _check_still_valid(model, source)
    _check_dtypes(model)
    _check_ceil_pools(model)
    return model


def _check_still_valid(model: onnx.ModelProto, source: onnx.ModelProto) -> None:
    """The normalised model passes the full ONNX check (shape inference included) if its source did: a
    rewrite that breaks a valid model is flatpack's bug, and is said to be one rather than blamed on the file."""
    try:
        onnx.checker.check_model(_light_copy(model), full_check=True)
        return
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError) as e:
        broken = e
    try:
        onnx.checker.check_model(source, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError):
        log.debug("the normalised model fails the full ONNX check, as its source does: %s", _first_line(broken))
        return
    raise ModelError(f"flatpack's normalisation made a valid model fail the ONNX checker ({_first_line(broken)}); "
                     "this is a flatpack bug: please report it with the model") from broken


def _check_dtypes(model: onnx.ModelProto) -> None:
    """Every tensor's element type has a numpy form (a corrupted or exotic file may name one that has not)."""
    g = model.graph
    typed = [(vi.name, vi.type.tensor_type.elem_type) for vi in [*g.input, *g.value_info, *g.output]
             if vi.type.HasField("tensor_type")]
    typed += [(t.name, t.data_type) for t in g.initializer]
    for name, elem in typed:
        try:
            onnx.helper.tensor_dtype_to_np_dtype(elem)
        except (KeyError, ValueError, TypeError):
            raise ModelError(f"tensor {name!r} has ONNX element type {elem}, which flatpack cannot run; "
                             "export the model with standard numeric types") from None


def _check_ceil_pools(model: onnx.ModelProto) -> None:
    """ONNX shape inference keeps a ceil_mode window that starts in the end padding; onnxruntime (and
    PyTorch) drop it. Such a model's declared shapes are wrong, so refuse it rather than mis-split it."""
    shapes = _static_shapes(model)
    for node in model.graph.node:
        if node.op_type not in ("MaxPool", "AveragePool", "LpPool"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if not attrs.get("ceil_mode"):
            continue
        in_shape, out_shape = shapes[node.input[0]], shapes[node.output[0]]
        nd = len(in_shape) - 2
        strides = list(attrs.get("strides", [1] * nd))
        pads = list(attrs.get("pads", [0] * (2 * nd)))
        for i in range(nd):
            if (out_shape[2 + i] - 1) * strides[i] >= in_shape[2 + i] + pads[i]:
                raise ModelError(
                    f"{node.op_type} {node.name!r} uses ceil_mode with a last window that starts in the padding; "
                    "ONNX shape inference and onnxruntime disagree on its output shape. Re-export it with "
                    "ceil_mode=False or an input size that avoids the partial window"
                )


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ModelError("model imports no default-domain opset")


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _constants_to_initializers(g: onnx.GraphProto) -> None:
    keep = []
    for node in g.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            attr = node.attribute[0] if node.attribute else None
            if attr is None:
                raise ModelError(f"Constant node {node.name!r} has no value")
            if attr.name == "value":
                t = copy.deepcopy(attr.t)
            elif attr.name in ("value_float", "value_int"):
                dtype = np.float32 if attr.name == "value_float" else np.int64
                t = numpy_helper.from_array(np.array(helper.get_attribute_value(attr), dtype=dtype))
            elif attr.name in ("value_floats", "value_ints"):
                dtype = np.float32 if attr.name == "value_floats" else np.int64
                t = numpy_helper.from_array(np.array(list(helper.get_attribute_value(attr)), dtype=dtype))
            else:
                raise ModelError(f"Constant node {node.name!r} uses unsupported attribute {attr.name!r}")
            t.name = node.output[0]
            g.initializer.append(t)
        else:
            keep.append(node)
    del g.node[:]
    g.node.extend(keep)


def _fix_input_shapes(g: onnx.GraphProto, shapes: dict[str, Sequence[int]], dims: dict[str, int]
                      ) -> dict[str, int]:
    """Give every graph input a static shape, in place, or raise one ModelError listing every problem;
    returns each symbolic dimension's name and the size it was given.

    Order of precedence per input: its whole shape from ``shapes`` (by name, or by position when no input
    has that name); else each symbolic axis from ``dims`` by name, or from the size a whole shape gave the
    same name in another input; else a leading axis (whose name, if any, is nowhere else) defaults to 1,
    the batch of a one-request-at-a-time server. Dimensions named ``?`` (or written -1, or unnamed) are
    anonymous: each is its own dimension, never shared with another axis.
    """
    names = [i.name for i in g.input]
    problems: list[str] = []
    shapes = _by_name(shapes, names, problems)
    named_at = {(i.name, axis): d.dim_param for i in g.input for axis, d in enumerate(i.type.tensor_type.shape.dim)
                if _symbol(d)}
    symbolic = _symbolic_axes(g)
    unused = sorted(set(dims) - set(symbolic))
    if unused:
        known = ", ".join(sorted(symbolic)) or "none"
        problems.append(f"--dim {', '.join(unused)}: no input has such a dimension (the inputs' symbolic "
                        f"dimensions: {known})")
    given = dims
    dims = {**_dims_from_shapes(g, shapes, dims), **dims}
    unfixed: dict[str, list[str]] = {}  # symbolic name ("" when anonymous) -> "input axis k" for each use
    for inp in g.input:
        tt = inp.type.tensor_type
        if inp.name in shapes:
            problems += _set_whole_shape(inp, shapes[inp.name], given)
            continue
        if not tt.HasField("shape"):
            problems.append(f"input {inp.name!r} has no shape; give one with --input-shape {inp.name}=...")
            continue
        for axis, d in enumerate(tt.shape.dim):
            if _is_static(d):
                continue
            label = _symbol(d)
            if label in dims:
                _set_dim(d, dims[label])
            elif axis == 0 and symbolic.get(label, {0}) == {0}:
                _set_dim(d, 1)  # batch: serving is one request at a time
            else:
                unfixed.setdefault(label, []).append(f"{inp.name} axis {axis}")
    if unfixed:
        problems.append(_unfixed_message(g, unfixed))
    resolved = _resolved_dims(g, named_at, problems)
    if problems:
        raise ModelError("; ".join(problems))
    return resolved


def _by_name(shapes: Mapping[str, Sequence[int]], names: Sequence[str], problems: list[str]
             ) -> dict[str, Sequence[int]]:
    """``--input-shape`` keyed by input name: a key that names no input but is a position is that input."""
    out: dict[str, Sequence[int]] = {}
    unknown = []
    for key, shape in shapes.items():
        if key in names:
            name = key
        elif key.isdigit() and int(key) < len(names):
            name = names[int(key)]
        else:
            unknown.append(key)
            continue
        if name in out and list(out[name]) != list(shape):
            problems.append(f"--input-shape gives input {name!r} twice (by name and by position), as "
                            f"{'x'.join(map(str, out[name]))} and {'x'.join(map(str, shape))}")
        out[name] = shape
    if unknown:
        problems.append(f"--input-shape names unknown input(s) {sorted(unknown)}; the model's inputs are {list(names)} "
                        f"(or give them by position, 0 to {len(names) - 1})")
    return out


def _dims_from_shapes(g: onnx.GraphProto, shapes: Mapping[str, Sequence[int]], dims: Mapping[str, int]
                      ) -> dict[str, int]:
    """Sizes that whole shapes give symbolic names, for the other inputs that use the same names: a name
    repeated on several axes of one input with different sizes says nothing (the whole shape wins)."""
    out: dict[str, int] = {}
    for inp in g.input:
        want = shapes.get(inp.name)
        have = inp.type.tensor_type.shape.dim
        if want is None or len(want) != len(have):
            continue
        sizes: dict[str, set[int]] = {}
        for d, v in zip(have, want, strict=True):
            if _symbol(d):
                sizes.setdefault(_symbol(d), set()).add(int(v))
        for label, vs in sizes.items():
            if len(vs) == 1 and label not in dims:
                out.setdefault(label, next(iter(vs)))
    return out


def _resolved_dims(g: onnx.GraphProto, named_at: Mapping[tuple[str, int], str], problems: list[str]
                   ) -> dict[str, int]:
    """Symbolic name -> the size its axes were given; a name given two sizes in two inputs is added to
    ``problems`` (one input that repeats a name with different sizes is the exporter's naming, not a
    conflict: its whole shape was given, and the name is not recorded)."""
    per_input: dict[str, dict[str, set[int]]] = {}
    for inp in g.input:
        for axis, d in enumerate(inp.type.tensor_type.shape.dim):
            label = named_at.get((inp.name, axis))
            if label and _is_static(d):
                per_input.setdefault(label, {}).setdefault(inp.name, set()).add(d.dim_value)
    resolved: dict[str, int] = {}
    for label, by_input in per_input.items():
        by_size: dict[int, list[str]] = {}
        for name, sizes in by_input.items():
            if len(sizes) == 1:
                by_size.setdefault(next(iter(sizes)), []).append(name)
        if len(by_size) > 1:
            given = ", ".join(f"{v} in {', '.join(names)}" for v, names in sorted(by_size.items()))
            problems.append(f"--input-shape gives {label!r} different sizes ({given}); give one size, or --dim "
                            f"{label}=N")
        elif by_size:
            resolved[label] = next(iter(by_size))
    return dict(sorted(resolved.items()))


def fixed_dims(model: onnx.ModelProto) -> dict[str, int]:
    """The symbolic input dimensions normalisation fixed, by name (``{"batch": 1, "seq": 128}``); empty for
    a model whose inputs were static."""
    for prop in model.metadata_props:
        if prop.key == DIMS_METADATA_KEY:
            return {str(k): int(v) for k, v in json.loads(prop.value).items()}
    return {}


def _record_dims(model: onnx.ModelProto, resolved: Mapping[str, int]) -> None:
    """Keep what the symbolic dimensions were fixed to in the model itself, so that the plan and the bundle's
    source model say it (the normalised inputs no longer carry the names). A model normalised before (a
    bundle's source) has static inputs and keeps the record it has."""
    if not resolved:
        return
    keep = [p for p in model.metadata_props if p.key != DIMS_METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    model.metadata_props.add(key=DIMS_METADATA_KEY, value=json.dumps(dict(resolved)))


def _is_static(d: onnx.TensorShapeProto.Dimension) -> bool:
    return d.HasField("dim_value") and d.dim_value > 0


#: Names exporters give a dimension that has no name: each such axis is its own dimension.
_ANONYMOUS = frozenset({"", "?", "-1", "unk", "None"})


def _symbol(d: onnx.TensorShapeProto.Dimension) -> str:
    """A dynamic dimension's shared name; "" for a static or anonymous one (``?``, -1, no name)."""
    if _is_static(d) or not d.HasField("dim_param") or d.dim_param.strip() in _ANONYMOUS:
        return ""
    return d.dim_param


def _set_dim(d: onnx.TensorShapeProto.Dimension, value: int) -> None:
    d.Clear()
    d.dim_value = int(value)


def _symbolic_axes(g: onnx.GraphProto) -> dict[str, set[int]]:
    """Symbolic dimension name -> the axes at which the graph's inputs use it (unnamed ones under "")."""
    out: dict[str, set[int]] = {}
    for inp in g.input:
        for axis, d in enumerate(inp.type.tensor_type.shape.dim):
            if _symbol(d):
                out.setdefault(_symbol(d), set()).add(axis)
    return out


def _set_whole_shape(inp: onnx.ValueInfoProto, want: Sequence[int], dims: Mapping[str, int]) -> list[str]:
    """Fix ``inp`` to ``want`` (``--input-shape``); the problems with that, if any, and nothing changed."""
    tt = inp.type.tensor_type
    if not tt.HasField("shape"):
        tt.shape.SetInParent()
        for _ in want:
            tt.shape.dim.add()
    have = tt.shape.dim
    if len(want) != len(have):
        return [f"--input-shape {inp.name} has rank {len(want)} but the model's input has rank {len(have)}"]
    problems = []
    for d, v in zip(have, want, strict=True):
        if _is_static(d) and d.dim_value != v:
            problems.append(f"--input-shape {inp.name}: dim {d.dim_value} is fixed by the model, not {v}")
        elif _symbol(d) in dims and dims[_symbol(d)] != v:
            problems.append(f"--input-shape {inp.name} gives {d.dim_param!r} as {v} but --dim {d.dim_param}="
                            f"{dims[d.dim_param]}")
    if not problems:
        for d, v in zip(have, want, strict=True):
            _set_dim(d, v)
    return problems


def _unfixed_message(g: onnx.GraphProto, unfixed: Mapping[str, list[str]]) -> str:
    """One sentence naming every unfixed dimension, where it is used, and the options that fix them all."""
    named = sorted(k for k in unfixed if k)
    where = [f"{k!r} ({', '.join(unfixed[k])})" for k in named]
    if "" in unfixed:
        where.append(f"unnamed ({', '.join(unfixed[''])})")
    dynamic = [inp for inp in g.input if not all(_is_static(d) for d in inp.type.tensor_type.shape.dim)]
    with_unnamed = {use.split(" axis ")[0] for use in unfixed.get("", [])}
    # an unnamed dimension can only be fixed per input; named ones by name, or per input for those who prefer
    fixes = [f"--dim {k}=N" for k in named] + [_shape_option(i) for i in dynamic if i.name in with_unnamed]
    alternative = f" (or per input: {' '.join(_shape_option(i) for i in dynamic)})" if not with_unnamed else ""
    return f"dynamic input dimensions are not fixed: {', '.join(where)}; pass {' '.join(fixes)}{alternative}"


def _shape_option(inp: onnx.ValueInfoProto) -> str:
    """``--input-shape NAME=1xNx64`` for ``inp``, N where a dimension is still dynamic."""
    dims = inp.type.tensor_type.shape.dim
    return f"--input-shape {inp.name}=" + "x".join(str(d.dim_value) if _is_static(d) else "N" for d in dims)


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference on a weightless copy (large initializers become typed inputs), so that it is fast
    and works above protobuf's 2 GB limit; the inferred shapes are copied back into ``model``.

    ONNX shape inference does not reach past ops it has no schema for (``com.microsoft`` contrib ops, other
    custom domains) or, in strict mode, ops whose inference it cannot finish: it is retried leniently, and
    what it still leaves without a static shape is taken from one onnxruntime run of the model on random
    inputs (onnxruntime runs the model; its shapes are the ones the parts will see)."""
    _onnx_infer(model)
    if _needs_runtime_shapes(model):
        missing = _unshaped(model)
        if missing:
            _shapes_from_onnxruntime(model, missing)
            _onnx_infer(model, keep=set(missing))
    return model


def _needs_runtime_shapes(model: onnx.ModelProto) -> bool:
    """Whether ONNX shape inference may not reach every tensor: ops of other domains, control flow, or a
    graph output it left without any shape."""
    g = model.graph
    return (any(n.domain not in ("", "ai.onnx") or n.op_type in ("If", "Loop", "Scan") for n in g.node)
            or any(not o.type.tensor_type.HasField("shape") for o in g.output))


def _onnx_infer(model: onnx.ModelProto, keep: set[str] | None = None) -> None:
    """ONNX shape inference into ``model`` (in place); the value infos named in ``keep`` are kept as they are
    and inferred from."""
    light = _light_copy(model)
    kept = [vi for vi in light.graph.value_info if keep and vi.name in keep]
    del light.graph.value_info[:]
    light.graph.value_info.extend(kept)
    for o in light.graph.output:
        if not (keep and o.name in keep):
            o.type.tensor_type.ClearField("shape")
    try:
        inferred = shape_inference.infer_shapes(light, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError) as strict:
        try:
            inferred = shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError) as e:
            raise ModelError(f"shape inference failed: {_first_line(e)}") from e
        log.debug("strict shape inference failed (%s); inferred leniently", _first_line(strict))
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)


def _unshaped(model: onnx.ModelProto) -> list[str]:
    """Tensors of the main graph (node outputs and graph outputs) without a static shape and dtype."""
    shapes = _static_shapes(model)
    typed = {vi.name for vi in [*model.graph.value_info, *model.graph.output]
             if vi.type.tensor_type.elem_type != onnx.TensorProto.UNDEFINED}
    names = [o for n in model.graph.node for o in n.output if o] + [o.name for o in model.graph.output]
    return list(dict.fromkeys(x for x in names if x not in shapes or x not in typed and x not in
                              {t.name for t in model.graph.initializer}))


def _shapes_from_onnxruntime(model: onnx.ModelProto, names: Sequence[str]) -> None:
    """Fill in the shapes and dtypes of ``names`` (in place) from one onnxruntime run on random inputs.

    Only tensor values are filled (a sequence or map output, e.g. scikit-learn's ZipMap, stays as
    declared). A model whose inputs are not all static yet, or that onnxruntime cannot run, is left as it
    is: the caller's later checks say what is missing."""
    import tempfile

    from functions.session import make_session
    from partitioner.inputs import random_inputs
    from partitioner.model_file import save_model

    if not all(_is_static(d) for i in model.graph.input for d in i.type.tensor_type.shape.dim):
        return
    probe = copy.deepcopy(model)
    declared = {o.name for o in probe.graph.output}
    keep = [vi for vi in probe.graph.value_info if vi.name not in names]
    del probe.graph.value_info[:]
    probe.graph.value_info.extend(keep)
    for o in probe.graph.output:
        if o.name in names:
            o.type.tensor_type.ClearField("shape")
    probe.graph.output.extend(helper.make_empty_tensor_value_info(x) for x in names if x not in declared)
    try:
        with tempfile.TemporaryDirectory(prefix="flatpack-shapes-") as tmp:
            path = save_model(probe, Path(tmp) / "probe.onnx")
            sess = make_session(path)
            wanted = [o.name for o in sess.get_outputs() if o.name in names]
            values = sess.run(wanted, random_inputs(probe))
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors have no common base; the caller reports
        log.debug("onnxruntime could not give the shapes of %s: %s", list(names)[:5], e)
        return
    found: dict[str, onnx.ValueInfoProto] = {}
    for name, v in zip(wanted, values, strict=True):
        if isinstance(v, np.ndarray):
            found[name] = helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
    for o in model.graph.output:
        if o.name in found:
            o.type.CopyFrom(found.pop(o.name).type)
    keep = [vi for vi in model.graph.value_info if vi.name not in found]
    del model.graph.value_info[:]
    model.graph.value_info.extend([*keep, *found.values()])


def _light_copy(model: onnx.ModelProto, keep_elements: int = 4096) -> onnx.ModelProto:
    """The model without the data of initializers above ``keep_elements`` (declared as inputs instead)."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    src = model.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    for t in src.initializer:
        if int(np.prod(t.dims)) <= keep_elements and t.data_location != onnx.TensorProto.EXTERNAL:
            g.initializer.append(t)
        else:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for t in model.graph.initializer:
        out[t.name] = tuple(int(d) for d in t.dims)
    return out


def _fold_to_fixpoint(model: onnx.ModelProto) -> onnx.ModelProto:
    """Fold constants and infer shapes again until a round folds nothing (``model`` has been inferred).

    One round is not enough for shapes computed at run time (a transformer exported with dynamic axes):
    folding ``Shape -> Gather -> Range`` makes the Range's output static only after the next inference,
    and only then is the ``Shape`` of what it feeds foldable. Each productive round removes nodes, so the
    loop ends; :data:`MAX_FOLD_ROUNDS` bounds the work on a pathological graph.
    """
    folded = 0
    max_rounds = MAX_FOLD_ROUNDS  # read per call, so that a test can lower it
    for _ in range(max_rounds):
        folded = _fold_constants(model)
        if not folded:
            return model
        model = _infer(model)
    raise ModelError(f"constant folding did not settle: {max_rounds} rounds of folding and shape inference, and "
                     f"the last still folded {folded} tensors; the model's shape arithmetic is unusually deep "
                     "(simplify it with onnxsim, or export it with static shapes)")


def _fold_constants(model: onnx.ModelProto) -> int:
    """Evaluate nodes whose inputs are all known (constants, or Shape/Size of statically shaped tensors),
    in place; returns how many tensors became initializers."""
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    shapes = _static_shapes(model)
    consts: dict[str, np.ndarray] = {}
    new_inits: list[onnx.TensorProto] = []
    keep: list[onnx.NodeProto] = []
    opsets = list(model.opset_import)
    graph_outputs = {o.name for o in g.output}

    init_by_name = {t.name: t for t in g.initializer}

    def const_fast(name: str) -> np.ndarray | None:
        if name in consts:
            return consts[name]
        t = init_by_name.get(name)
        if t is None:
            return None
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        if n > _FOLD_MAX_ELEMENTS:
            return None
        consts[name] = numpy_helper.to_array(t)
        return consts[name]

    for node in g.node:
        foldable = (node.domain in ("", "ai.onnx") and not node.op_type.startswith("Random")
                    and node.op_type not in _NEVER_FOLD and not any(o in graph_outputs for o in node.output))
        values: list[np.ndarray] | None = None
        if foldable and node.op_type in ("Shape", "Size") and node.input[0] in shapes:
            shape = shapes[node.input[0]]
            if node.op_type == "Size":
                values = [np.array(int(np.prod(shape)), dtype=np.int64)]
            else:
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                start, end = attrs.get("start", 0), attrs.get("end", len(shape))
                values = [np.array(shape[start:end], dtype=np.int64)]
        elif foldable and node.op_type not in ("Shape", "Size") and all(
            not i or i in consts or i in init_by_name for i in node.input
        ):
            ins = [const_fast(i) if i else None for i in node.input]
            if all(x is not None or not name for x, name in zip(ins, node.input, strict=True)) and node.input:
                try:
                    sub = helper.make_model(
                        helper.make_graph(
                            [node],
                            "fold",
                            [
                                helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                                for n, x in zip(node.input, ins, strict=True)
                                if n and x is not None
                            ],
                            [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output],
                        ),
                        opset_imports=opsets,
                    )
                    feeds = {n: x for n, x in zip(node.input, ins, strict=True) if n and x is not None}
                    outs = ReferenceEvaluator(sub).run(None, feeds)
                    # typed dict | list: a dict only for intermediate=True, which folding never asks for
                    values = list(outs) if isinstance(outs, list) else None
                except Exception as e:  # noqa: BLE001 - any failure just means "don't fold this node"
                    log.debug("not folding %s (%s): %s", node.name, node.op_type, e)
                    values = None
                if values is not None and any(np.asarray(v).size > _FOLD_MAX_ELEMENTS for v in values):
                    values = None
        if values is None:
            keep.append(node)
            continue
        for name, v in zip(node.output, values, strict=False):
            if not name:
                continue
            arr = np.asarray(v)
            consts[name] = arr
            t = numpy_helper.from_array(arr, name)
            new_inits.append(t)
            init_by_name[name] = t
    if new_inits:
        log.debug("folded %d constant tensors", len(new_inits))
        del g.node[:]
        g.node.extend(keep)
        g.initializer.extend(new_inits)
        _drop_unused_initializers(g)
    return len(new_inits)


def _drop_unused_initializers(g: onnx.GraphProto) -> None:
    used = {i for n in g.node for i in [*n.input, *outer_scope_inputs(n)]} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)


def outer_scope_inputs(node: onnx.NodeProto) -> list[str]:
    """Tensors of the enclosing graph that ``node``'s subgraphs (If branches, Loop and Scan bodies) read
    without their being listed among its inputs, in first-use order; empty for a node without subgraphs."""
    out: dict[str, None] = {}
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            _collect_outer(sub, set(), out)
    return list(out)


def _collect_outer(g: onnx.GraphProto, bound: set[str], out: dict[str, None]) -> None:
    local = set(bound) | {i.name for i in g.input} | {t.name for t in g.initializer}
    for node in g.node:
        for x in node.input:
            if x and x not in local:
                out[x] = None
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _collect_outer(sub, local, out)
        local.update(o for o in node.output if o)


def _require_static_shapes(model: onnx.ModelProto) -> None:
    """Every tensor has a static shape; the inputs' are fixed by now, so one without depends on values."""
    shapes = _static_shapes(model)
    missing: dict[str, onnx.NodeProto] = {}
    for node in model.graph.node:
        for name in [*node.input, *node.output]:
            if name and name not in shapes:
                missing.setdefault(name, node)
    if missing:
        name, node = next(iter(missing.items()))
        others = f" (and {len(missing) - 1} more tensors)" if len(missing) > 1 else ""
        raise ModelError(
            f"tensor {name!r} ({node.op_type} node {node.name!r}) has no static shape after shape inference"
            f"{others}, although every input dimension is fixed: its size depends on tensor values flatpack "
            "cannot fold (NonZero, a data-dependent Reshape) or on an op ONNX shape inference does not cover; "
            "export the model with static shapes"
        )
