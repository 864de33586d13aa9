"""Lossless codecs on real split-point tensors: the other per-edge option besides an autoencoder.

zstd at level 1 and lz4 are what the runtime's tensor codec (:mod:`functions.codec`) sends; zstd at
level 3 is measured as well to show what a slower level would buy. Both packages are optional: a codec
whose package is missing is left out of the results (and logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_CODECS", "WIRE_CODECS", "LosslessResult", "measure_lossless"]

log = logging.getLogger(__name__)

#: (codec, level) pairs the runtime's tensor codec uses.
WIRE_CODECS: tuple[tuple[str, int | None], ...] = (("zstd", 1), ("lz4", None))
DEFAULT_CODECS: tuple[tuple[str, int | None], ...] = (("zstd", 1), ("zstd", 3), ("lz4", None))


@dataclass(frozen=True)
class LosslessResult:
    """One codec on ``samples`` tensors: mean bytes, and median milliseconds per tensor.

    ``wire``: this codec and level is what :mod:`functions.codec` sends (so a plan can pick it).
    """

    codec: str
    level: int | None
    samples: int
    bytes_before: int
    bytes_after: float
    compress_ms: float
    decompress_ms: float
    wire: bool

    @property
    def ratio(self) -> float:
        return self.bytes_before / self.bytes_after if self.bytes_after else float("inf")

    @property
    def label(self) -> str:
        return self.codec if self.level is None else f"{self.codec}-{self.level}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LosslessResult:
        return cls(str(d["codec"]), None if d.get("level") is None else int(d["level"]), int(d["samples"]),
                   int(d["bytes_before"]), float(d["bytes_after"]), float(d["compress_ms"]),
                   float(d["decompress_ms"]), bool(d["wire"]))


def _codec(name: str, level: int | None) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]] | None:
    try:
        if name == "zstd":
            import zstandard

            c = zstandard.ZstdCompressor(level=level or 1)
            d = zstandard.ZstdDecompressor()
            return c.compress, d.decompress
        if name == "lz4":
            import lz4.frame

            return lz4.frame.compress, lz4.frame.decompress
    except ImportError:
        log.info("codec %s is not installed (pip install zstandard lz4); left out", name)
        return None
    raise ValueError(f"unknown lossless codec {name!r}; use zstd or lz4")


def measure_lossless(tensors: np.ndarray, *, codecs: Sequence[tuple[str, int | None]] = DEFAULT_CODECS,
                     samples: int = 32) -> list[LosslessResult]:
    """Compress up to ``samples`` tensors (rows of ``tensors``, each one transfer) with every codec."""
    rows = [np.ascontiguousarray(t).tobytes() for t in tensors[:samples]]
    if not rows:
        return []
    out = []
    for name, level in codecs:
        fns = _codec(name, level)
        if fns is None:
            continue
        compress, decompress = fns
        sizes, c_ms, d_ms = [], [], []
        for raw in rows:
            t0 = time.perf_counter()
            packed = compress(raw)
            t1 = time.perf_counter()
            back = decompress(packed)
            t2 = time.perf_counter()
            if back != raw:
                raise RuntimeError(f"{name} did not round-trip a tensor")
            sizes.append(len(packed))
            c_ms.append((t1 - t0) * 1e3)
            d_ms.append((t2 - t1) * 1e3)
        out.append(LosslessResult(name, level, len(rows), len(rows[0]), float(np.mean(sizes)),
                                  float(np.median(c_ms)), float(np.median(d_ms)), (name, level) in WIRE_CODECS))
    return out
