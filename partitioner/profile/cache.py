"""Measurements on disk, and what they are keyed by: the model's content and this machine."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import onnx

from functions.settings import cache_dir
from partitioner.profile.types import FORMAT_VERSION, Measurement

__all__ = ["ProfileCache", "default_cache_dir", "machine_info", "model_sha256"]

log = logging.getLogger(__name__)


@cache
def machine_info() -> dict[str, Any]:
    """What measurements depend on: CPU, cores, onnxruntime and Python versions, and an ``id`` hashing them
    with the machine id (so a cache copied to another machine is not mistaken for this one's)."""
    import onnxruntime as ort

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    mid = ""
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError):
            mid = Path(p).read_text().strip()
            break
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count() or 1,
        "onnxruntime": ort.__version__,
        "python": platform.python_version(),
        "system": platform.system(),
    }
    raw = json.dumps({**info, "machine_id": mid or platform.node(), "format": FORMAT_VERSION}, sort_keys=True)
    info["id"] = hashlib.sha256(raw.encode()).hexdigest()[:16]
    return info


def model_sha256(model: onnx.ModelProto) -> str:
    """A content hash of a model: graph structure, opsets and every initializer's bytes.

    Hashes piece by piece, so it works for models above protobuf's 2 GB serialisation limit.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected onnx.ModelProto, got {type(model).__name__}")
    h = hashlib.sha256()
    for o in model.opset_import:
        h.update(o.SerializeToString())
    g = model.graph
    for group in (g.input, g.output, g.node, g.initializer):
        h.update(len(group).to_bytes(8, "little"))
        for item in group:
            b = item.SerializeToString()
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def default_cache_dir() -> Path:
    """``profiles`` under flatpack's cache directory (:func:`functions.settings.cache_dir`:
    ``$FLATPACK_CACHE_DIR``, default ``~/.cache/flatpack``)."""
    return cache_dir() / "profiles"


class ProfileCache:
    """Measurements on disk, one JSON file each, under ``root/<machine id>/``.

    Keys are made with :meth:`key` from content identifiers (a model hash, a unit index, a thread
    count, ...); the machine fingerprint is part of the directory, so another machine's (or another
    onnxruntime's) measurements are never returned. Writes are atomic (temp file + rename), so
    concurrent profilers can share a cache.
    """

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.dir = self.root / machine_info()["id"]

    @staticmethod
    def key(*parts: object) -> str:
        return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get_json(self, key: str) -> dict[str, Any] | None:
        p = self._path(key)
        try:
            with open(p) as f:
                d = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable cache entry %s: %s", p, e)
            return None
        return d if isinstance(d, dict) else None

    def put_json(self, key: str, value: Mapping[str, Any]) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(value, f)
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def get(self, key: str) -> Measurement | None:
        d = self.get_json(key)
        if d is None or "measurement" not in d:
            return None
        try:
            return Measurement.from_json(d["measurement"])
        except (KeyError, TypeError, ValueError) as e:
            log.warning("ignoring malformed cache entry %s: %s", key, e)
            return None

    def put(self, key: str, m: Measurement, **meta: Any) -> None:
        self.put_json(key, {"measurement": m.to_json(), **meta})

