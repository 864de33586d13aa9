"""How flatpack decides that split execution reproduces the model: one relative error, one tolerance.

Every check uses these (export's verification, ``flatpack verify``, ``flatpack run``'s output check, the
benchmarks' correctness counts, the tests), so "equal to the model" means the same thing everywhere.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_TOLERANCE", "rel_err"]

#: The largest :func:`rel_err` split execution may show against the unsplit model.
DEFAULT_TOLERANCE = 1e-4


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """``max|got - want| / max(1, max|want|)``, computed in float64.

    The denominator's floor of 1 makes it an absolute error for small outputs (a logit near 0 is not held
    to a relative bound it cannot meet in float32). Non-float outputs (indices, masks) must be equal:
    0 if they are, inf if not. inf on a shape mismatch or a non-finite difference (a NaN anywhere);
    0 for empty tensors.
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    if not np.issubdtype(want.dtype, np.floating):
        return 0.0 if np.array_equal(got, want) else float("inf")
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    if not np.all(np.isfinite(diff)):
        return float("inf")
    return float(diff.max() / max(1.0, float(np.abs(want.astype(np.float64)).max())))
