"""How close the compressed model stays to the original on held-out inputs."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["Fidelity", "measure_fidelity"]


@dataclass(frozen=True)
class Fidelity:
    """Figures over ``samples`` held-out inputs.

    Attributes:
        agreement: fraction of inputs whose top-1 class (argmax of the first output) is the same with and
            without compression.
        rel_err: mean over inputs of ``||y_ae - y||_2 / ||y||_2`` on the first output.
        accuracy_full, accuracy_ae: top-1 accuracy against ground-truth labels, when there are labels.
        reconstruction_err: ``||T_hat - T||_2 / ||T||_2`` of the decoded split tensor over all inputs.
        classes: distinct top-1 classes the uncompressed model predicts on these inputs. A random-weight
            model that predicts one class for everything makes agreement meaningless; this shows it.
        spread_err: ``||Y_ae - Y||_F / ||Y - mean(Y)||_F`` over the inputs (first output): the error
            relative to how much the output varies from input to input. Where a constant part dominates
            the outputs (random weights), ``rel_err`` looks small while this one shows whether the
            input-dependent part survives compression.
    """

    samples: int
    agreement: float
    rel_err: float
    accuracy_full: float | None = None
    accuracy_ae: float | None = None
    reconstruction_err: float = math.nan
    classes: int = 0
    spread_err: float = math.nan

    @property
    def accuracy_drop(self) -> float:
        """``accuracy_full - accuracy_ae`` with labels; without, the disagreement ``1 - agreement``, which
        bounds the drop from above (only inputs whose prediction changed can change the accuracy)."""
        if self.accuracy_full is not None and self.accuracy_ae is not None:
            return self.accuracy_full - self.accuracy_ae
        return 1.0 - self.agreement

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "accuracy_drop": self.accuracy_drop}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Fidelity:
        return cls(int(d["samples"]), float(d["agreement"]), float(d["rel_err"]),
                   None if d.get("accuracy_full") is None else float(d["accuracy_full"]),
                   None if d.get("accuracy_ae") is None else float(d["accuracy_ae"]),
                   float(d.get("reconstruction_err", math.nan)), int(d.get("classes", 0)),
                   float(d.get("spread_err", math.nan)))


def measure_fidelity(full: np.ndarray, compressed: np.ndarray, labels: np.ndarray | None = None, *,
                     activations: np.ndarray | None = None, reconstructed: np.ndarray | None = None) -> Fidelity:
    """Compare ``compressed`` outputs with ``full`` ones (both ``[n, ...]``, one row per input)."""
    n = len(full)
    if compressed.shape != full.shape or n == 0:
        raise ValueError(f"outputs of shape {compressed.shape} and {full.shape} cannot be compared")
    f = full.reshape(n, -1).astype(np.float64)
    c = compressed.reshape(n, -1).astype(np.float64)
    top_f, top_c = f.argmax(1), c.argmax(1)
    rel = np.linalg.norm(c - f, axis=1) / np.maximum(np.linalg.norm(f, axis=1), 1e-12)
    acc_f = acc_c = None
    if labels is not None:
        acc_f, acc_c = float(np.mean(top_f == labels)), float(np.mean(top_c == labels))
    recon = math.nan
    if activations is not None and reconstructed is not None:
        a = activations.astype(np.float64)
        recon = float(np.linalg.norm(reconstructed.astype(np.float64) - a) / max(float(np.linalg.norm(a)), 1e-12))
    spread = float(np.linalg.norm(f - f.mean(axis=0)))
    spread_err = float(np.linalg.norm(c - f) / spread) if spread > 0 else math.inf
    return Fidelity(n, float(np.mean(top_f == top_c)), float(rel.mean()), acc_f, acc_c, recon,
                    len(np.unique(top_f)), spread_err)
