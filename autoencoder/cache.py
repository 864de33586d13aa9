"""Trained autoencoders on disk, keyed by what determines them.

An entry is a directory ``<root>/<key>/`` holding ``encoder.onnx``, ``decoder.onnx`` and ``metrics.json``
(the design, training and fidelity figures; JSON, never pickle). The key is a sha256 over the model's
sha256, the split tensor, the ratio, the training configuration, the calibration data's fingerprint and
:data:`CACHE_FORMAT`, so any change to one of them trains anew. Entries are written to a temporary
directory and renamed into place, so a reader never sees half an entry; an unreadable entry is a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from autoencoder.config import TrainConfig
from functions.settings import cache_dir

__all__ = ["CACHE_FORMAT", "AutoencoderCache", "CacheEntry", "cache_key"]

log = logging.getLogger(__name__)

#: Bumped when the training procedure or the entry layout changes, so older entries are not reused.
CACHE_FORMAT = 2


def cache_key(*, model_sha256: str, tensor: str, ratio: float, config: TrainConfig, calibration: str) -> str:
    """The sha256 (hex) naming one trained autoencoder."""
    doc = {"format": CACHE_FORMAT, "model": model_sha256, "tensor": tensor, "ratio": float(ratio),
           "config": config.to_json(), "calibration": calibration}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path
    encoder: onnx.ModelProto
    decoder: onnx.ModelProto
    metrics: dict[str, Any]


class AutoencoderCache:
    """A directory of trained autoencoders (default: ``autoencoders`` in flatpack's cache,
    :func:`functions.settings.cache_dir`)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir() / "autoencoders"

    def _dir(self, key: str) -> Path:
        return self.root / key[:32]

    def lock_path(self, key: str) -> Path:
        """The file whose lock a process holds while it trains the entry for ``key``."""
        return self.root / f".{key[:32]}.lock"

    def load(self, key: str) -> CacheEntry | None:
        """The entry for ``key``, or None if there is none or it cannot be read."""
        d = self._dir(key)
        if not d.is_dir():
            return None
        try:
            metrics = json.loads((d / "metrics.json").read_text())
            if metrics.get("key") != key:
                return None
            encoder = onnx.load(str(d / "encoder.onnx"))
            decoder = onnx.load(str(d / "decoder.onnx"))
        except (OSError, ValueError, DecodeError) as e:
            log.warning("ignoring unreadable autoencoder cache entry %s: %s", d, e)
            return None
        return CacheEntry(key, d, encoder, decoder, metrics)

    def store(self, key: str, encoder: onnx.ModelProto, decoder: onnx.ModelProto, metrics: dict[str, Any]) -> Path:
        """Write an entry (replacing any with the same key) and return its directory."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self._dir(key)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=self.root))
        try:
            onnx.save(encoder, str(tmp / "encoder.onnx"))
            onnx.save(decoder, str(tmp / "decoder.onnx"))
            (tmp / "metrics.json").write_text(json.dumps({**metrics, "key": key}, indent=1) + "\n")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return final

    def clear(self) -> int:
        """Remove every entry; returns how many there were."""
        if not self.root.is_dir():
            return 0
        entries = [p for p in self.root.iterdir() if p.is_dir()]
        for p in entries:
            shutil.rmtree(p, ignore_errors=True)
        return len(entries)
