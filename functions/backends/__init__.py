"""Part-execution backends: what runs a part's ONNX file inside a function.

``onnxruntime`` (the default) runs in flatpack's own environment; ``mxnet`` (MXNet 1.9, Gillis's serving
backend) runs in a separate environment with numpy < 1.24 (``flatpack backend setup mxnet``). Both give
a session cache with the same interface (``get``, ``input_names``, ``run``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import numpy as np

    from functions.backends.mxnet import MXNetSessionCache
    from functions.session import SessionCache

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "Backend",
    "PartSessions",
    "backend_memory_mb",
    "check_backend",
    "make_session_cache",
]

Backend = Literal["onnxruntime", "mxnet"]
BACKENDS: tuple[str, ...] = ("onnxruntime", "mxnet")
DEFAULT_BACKEND: Backend = "onnxruntime"


class PartSessions(Protocol):
    """What the worker and master roles run parts with: a backend's session cache, keyed by part file."""

    def get(self, path: str | Path) -> object:
        """The loaded part (created on first use)."""
        ...

    def input_names(self, path: str | Path) -> list[str]: ...

    def warm_up(self, path: str | Path) -> bool:
        """Run the part once on zeros (its first request then runs warm); whether it could."""
        ...

    def run(self, path: str | Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def __len__(self) -> int: ...


def check_backend(name: str) -> str:
    """``name`` if it is a known backend; ValueError naming the choices otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")
    return name


# Resident memory a backend needs beyond onnxruntime's, which plans are sized for (partitioner.export):
# a fixed part (MXNet 1.9's library and onnx, measured: an MXNet instance holding one small part has
# ~95 MB more resident than an onnxruntime one) and a factor of the part files' bytes (MXNet's importer
# holds the weights as numpy and as NDArrays while it binds).
_EXTRA_BASE_MB = {"onnxruntime": 0, "mxnet": 128}
_EXTRA_PER_WEIGHT_BYTE = {"onnxruntime": 0.0, "mxnet": 1.0}


def backend_memory_mb(backend: str, plan_mb: int, part_bytes: int, *, step_mb: int = 64) -> int:
    """Memory for a function the plan sized at ``plan_mb`` (for onnxruntime) that runs parts of
    ``part_bytes`` bytes with ``backend``; unchanged for onnxruntime, else rounded up to ``step_mb``."""
    check_backend(backend)
    extra = _EXTRA_BASE_MB[backend] + _EXTRA_PER_WEIGHT_BYTE[backend] * part_bytes / 2**20
    if extra <= 0:
        return plan_mb
    return int(-(-(plan_mb + extra) // step_mb) * step_mb)


def make_session_cache(backend: str = DEFAULT_BACKEND, *, intra_op_threads: int = 0, memory_mb: float | None = None
                       ) -> SessionCache | MXNetSessionCache:
    """The session cache of ``backend`` (its library is imported when the first part is loaded); ``memory_mb``:
    the function's memory size, which onnxruntime's warm-up stays under when it maps the weights in."""
    if check_backend(backend) == "mxnet":
        from functions.backends.mxnet import MXNetSessionCache

        return MXNetSessionCache(intra_op_threads=intra_op_threads)
    from functions.session import SessionCache

    return SessionCache(intra_op_threads=intra_op_threads, memory_mb=memory_mb)
