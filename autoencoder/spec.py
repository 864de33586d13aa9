"""The user's compression choice, as the CLI takes it: ``--compress none|lossless|ae[:R]`` and
``--max-accuracy-drop 0.5%``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_AE_RATIOS", "DEFAULT_MAX_ACCURACY_DROP", "CompressKind", "CompressSpec", "parse_accuracy_drop",
           "parse_compress"]

CompressKind = Literal["none", "lossless", "ae"]

#: ``--max-accuracy-drop`` when not given: half a point of top-1 accuracy (issue 22).
DEFAULT_MAX_ACCURACY_DROP = 0.005

#: Ratios tried for ``--compress ae`` without an explicit ratio.
DEFAULT_AE_RATIOS: tuple[float, ...] = (2.0, 4.0, 8.0)

_PLAIN: tuple[CompressKind, ...] = ("none", "lossless")  # the kinds that take no ratio


@dataclass(frozen=True)
class CompressSpec:
    """What the planner may use on an edge: nothing (``none``), a lossless codec (``lossless``), or a
    lossless codec or an autoencoder (``ae``) at ``ratios``."""

    kind: CompressKind = "none"
    ratios: tuple[float, ...] = ()

    def __str__(self) -> str:
        if self.kind != "ae" or self.ratios == DEFAULT_AE_RATIOS:
            return self.kind
        return "ae:" + ",".join(f"{r:g}" for r in self.ratios)


def parse_compress(text: str) -> CompressSpec:
    """``none``, ``lossless``, ``ae`` (ratios 2, 4, 8) or ``ae:R[,R...]``.

    Raises:
        ValueError: anything else, or a ratio that is not a number above 1.
    """
    raw = text.strip().lower()
    if raw in _PLAIN:
        return CompressSpec(raw)
    if raw == "ae":
        return CompressSpec("ae", DEFAULT_AE_RATIOS)
    if raw.startswith("ae:"):
        try:
            ratios = tuple(float(r) for r in raw[3:].split(","))
        except ValueError:
            ratios = ()
        if ratios and all(r > 1 and math.isfinite(r) for r in ratios):
            return CompressSpec("ae", ratios)
        raise ValueError(f"--compress {text!r}: the ratio after 'ae:' must be a number above 1, e.g. ae:4")
    raise ValueError(f"--compress {text!r} is not one of none, lossless, ae, ae:R (e.g. ae:4)")


def parse_accuracy_drop(text: str) -> float:
    """An accuracy drop bound as a fraction: ``0.5%`` -> 0.005, ``0.005`` -> 0.005.

    Raises:
        ValueError: not a number, or outside [0, 100 %].
    """
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"--max-accuracy-drop {text!r} is not a number; write it as 0.5% or 0.005") from None
    if not 0 <= value <= 1:
        raise ValueError(f"--max-accuracy-drop {text!r} must lie between 0 and 100%")
    return value
