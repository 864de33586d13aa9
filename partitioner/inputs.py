"""Random but valid inputs for a model: floats, token ids within the embedding table, masks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

__all__ = ["random_inputs"]


def random_inputs(model: onnx.ModelProto | str | Path, seed: int = 0) -> dict[str, np.ndarray]:
    """One random input per model input, with static shapes (dynamic dims taken as 1).

    Integer inputs that index a Gather get values within the gathered axis; inputs named like masks get
    ones with a random tail of zeros (never all zeros); other integers are 0/1.
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    rng = np.random.default_rng(seed)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    out: dict[str, np.ndarray] = {}
    for inp in g.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        shape = tuple(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim)
        if np.issubdtype(dtype, np.floating):
            out[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            out[inp.name] = rng.random(shape) < 0.5
        elif "mask" in inp.name.lower():
            mask = np.ones(shape, dtype=dtype)
            if shape and shape[-1] > 1:
                keep = int(rng.integers(max(1, shape[-1] // 2), shape[-1] + 1))
                mask[..., keep:] = 0
            out[inp.name] = mask
        else:
            high = _gather_bound(g, inp.name, inits) or 2
            out[inp.name] = rng.integers(0, high, size=shape).astype(dtype)
    return out


def _gather_bound(g: onnx.GraphProto, name: str, inits: dict[str, onnx.TensorProto]) -> int | None:
    """Size of the axis an input indexes, following Cast/Reshape/Unsqueeze to a Gather."""
    frontier = {name}
    for _ in range(8):
        nxt = set()
        for node in g.node:
            if not frontier.intersection(node.input):
                continue
            if node.op_type == "Gather" and node.input[1] in frontier and node.input[0] in inits:
                axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
                dims = list(inits[node.input[0]].dims)
                return int(dims[axis])
            if node.op_type in ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten"):
                nxt.update(node.output)
        if not nxt:
            return None
        frontier = nxt
    return None
