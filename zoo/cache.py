"""Zoo models built once and kept in flatpack's cache, and the ``MODEL`` argument of the CLI and the
benchmarks: an ONNX file, or the name of a zoo model.

Nothing here imports torch until a model has to be built, so resolving a file needs no zoo extra.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from functions.filelock import exclusive
from functions.settings import cache_dir
from zoo.errors import ZooError

__all__ = ["model_file", "zoo_file"]

log = logging.getLogger(__name__)


def zoo_file(name: str, *, width_div: int = 1, input_size: int | None = None) -> Path:
    """The zoo model ``name`` at ``width_div`` / ``input_size`` as an ONNX file under the cache
    (``<cache>/zoo/<tag>.onnx``), built on first use. torch's export is deterministic for a seed, so a
    cached file is the same model. Processes asking for a model being built wait for it rather than build it
    too (a lock per model), and none ever sees a half-written file: the model (with its external data, if
    it has any) is built in a directory of its own and moved into place, the model file last.

    Raises:
        ZooError: ``name`` or the options are not a zoo model; ImportError: torch is not installed.
    """
    tag = name if (width_div, input_size) == (1, None) else \
        f"{name}-w{width_div}" + (f"-s{input_size}" if input_size else "")
    path = cache_dir() / "zoo" / f"{tag}.onnx"
    if path.is_file():
        return path
    with exclusive(path.with_name(f".{path.name}.lock")):
        if path.is_file():  # built by the process this one waited for
            return path
        from zoo.builder import build_to_file  # torch: only when something has to be built

        log.info("building zoo model %s (once; cached in %s)", tag, path.parent)
        staging = Path(tempfile.mkdtemp(prefix=f".{tag}.", dir=path.parent))
        try:
            built = build_to_file(name, staging / path.name, width_div=width_div, input_size=input_size)
            data = built.with_name(built.name + ".data")  # external data is named after its model file
            if data.exists():
                data.replace(path.with_name(data.name))
            built.replace(path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path


def model_file(arg: str | Path) -> Path:
    """``arg`` if it is a file; else the zoo model of that name (full size, default options), built once
    into the cache.

    Raises:
        ZooError: ``arg`` is neither an existing file nor a zoo model name (a path-like ``arg``, one with
            a ``/`` or an ``.onnx`` suffix, is reported as a missing file). ImportError: ``arg`` names a
            zoo model and torch is not installed.
    """
    path = Path(arg)
    if path.is_file():
        return path
    if path.suffix == ".onnx" or "/" in str(arg):
        raise ZooError(f"{arg}: no such file")
    try:
        return zoo_file(str(arg))
    except ZooError as e:
        raise ZooError(f"{arg} is neither a file nor a zoo model: {e}") from e
