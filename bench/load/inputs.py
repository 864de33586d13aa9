"""The inputs a load sends, and the outputs each must come back with: the unsplit model's, by onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from functions.compare import rel_err

__all__ = ["DEFAULT_TOLERANCE", "InputPool"]

DEFAULT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class InputPool:
    """K inputs and the outputs the unsplit model gives for them; request i uses entry i mod K."""

    inputs: list[dict[str, np.ndarray]]
    expected: list[dict[str, np.ndarray]]
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self) -> None:
        if not self.inputs or len(self.inputs) != len(self.expected):
            raise ValueError(f"an input pool needs as many expected outputs as inputs (>= 1); got "
                             f"{len(self.inputs)} inputs, {len(self.expected)} expected")

    def __len__(self) -> int:
        return len(self.inputs)

    @classmethod
    def from_model(cls, source: str | Path, k: int = 8, *, seed: int = 0, tolerance: float = DEFAULT_TOLERANCE
                   ) -> InputPool:
        """``k`` seeded random inputs for ``source`` (an ONNX file) and onnxruntime's outputs for them."""
        from functions.session import make_session
        from partitioner.inputs import random_inputs

        if k < 1:
            raise ValueError(f"the input pool needs at least 1 input, got {k}")
        import onnx

        model = onnx.load(str(source), load_external_data=False)
        sess = make_session(source)
        names = [o.name for o in sess.get_outputs()]
        inputs = [random_inputs(model, seed + i) for i in range(k)]
        expected = [dict(zip(names, sess.run(names, x), strict=True)) for x in inputs]
        return cls(inputs, expected, tolerance)

    @classmethod
    def from_bundle(cls, bundle_dir: str | Path, k: int = 8, *, seed: int = 0,
                    tolerance: float = DEFAULT_TOLERANCE) -> InputPool:
        return cls.from_model(Path(bundle_dir) / "source.onnx", k, seed=seed, tolerance=tolerance)

    def check(self, i: int, outputs: Mapping[str, np.ndarray]) -> tuple[bool, float]:
        """(correct, max relative error) of ``outputs`` for request ``i``: every expected output present,
        same shape, max|got - want| / max(1, max|want|) within the tolerance (integer outputs exactly equal;
        :func:`partitioner.verify.rel_err`)."""
        want = self.expected[i % len(self.expected)]
        err = max((rel_err(outputs[k], v) if k in outputs else float("inf") for k, v in want.items()), default=0.0)
        return bool(err <= self.tolerance), err
