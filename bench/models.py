"""Benchmark models built once and kept in flatpack's cache (zoo variants by width and input size)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["zoo_file"]


def zoo_file(name: str, *, width_div: int = 1, input_size: int | None = None) -> Path:
    """The zoo model ``name`` at ``width_div`` / ``input_size`` as an ONNX file under the cache (built on
    first use; torch's export is deterministic for a seed, so a cached file is the same model)."""
    from bench.zoo import build_to_file
    from partitioner.planner import cache_dir

    tag = f"{name}-w{width_div}" + (f"-s{input_size}" if input_size else "")
    path = cache_dir() / "zoo" / f"{tag}.onnx"
    if not path.is_file():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        build_to_file(name, tmp, width_div=width_div, input_size=input_size)
        data = tmp.with_name(tmp.name + ".data")
        if data.exists():  # external data is named after the file: keep the pair together under the final name
            build_to_file(name, path, width_div=width_div, input_size=input_size)
            tmp.unlink(missing_ok=True)
            data.unlink(missing_ok=True)
        else:
            tmp.replace(path)
    return path
