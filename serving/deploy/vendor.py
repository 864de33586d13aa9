"""Dependencies for a Lambda package: manylinux x86_64 wheels of numpy + onnxruntime, installed with pip.

pip's platform options (``--platform --python-version --implementation --only-binary=:all:``) install
the wheels the Lambda runtime's Linux can load, whatever this machine is; nothing is compiled. The
result is cached per runtime and requirement set (``$FLATPACK_CACHE_DIR/lambda-vendor``) and copied.

Which wheels fit which runtime (AWS Lambda runtimes documentation):

* ``python3.11`` runs on Amazon Linux 2 (glibc 2.26): only manylinux2014 (glibc 2.17) wheels load there,
  and the last onnxruntime built for it is 1.16, which needs numpy 1.x (it was compiled against it).
  It is the newest Python runtime that the Serverless Framework v3 validates.
* ``python3.12`` / ``python3.13`` run on Amazon Linux 2023 (glibc 2.34): manylinux_2_28 wheels, so the
  newest onnxruntime and numpy 2.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from functions.settings import cache_dir

__all__ = ["RUNTIMES", "VendorError", "WheelTarget", "vendor_dependencies"]

log = logging.getLogger(__name__)


class VendorError(RuntimeError):
    """pip could not install the function's dependencies for the Lambda platform."""


@dataclass(frozen=True)
class WheelTarget:
    """What pip installs for one Lambda runtime."""

    python_version: str
    platforms: tuple[str, ...]
    requirements: tuple[str, ...]


RUNTIMES: dict[str, WheelTarget] = {
    "python3.11": WheelTarget("3.11", ("manylinux2014_x86_64",), ("numpy>=1.26,<2", "onnxruntime>=1.16,<1.17")),
    "python3.12": WheelTarget("3.12", ("manylinux_2_28_x86_64", "manylinux2014_x86_64"),
                              ("numpy>=2", "onnxruntime>=1.20")),
    "python3.13": WheelTarget("3.13", ("manylinux_2_28_x86_64", "manylinux2014_x86_64"),
                              ("numpy>=2.1", "onnxruntime>=1.20")),
}

# What the function never imports: test suites, onnxruntime's offline tools (they pull sympy & co.).
_PRUNE_DIRS = ("tests", "__pycache__", "transformers", "quantization", "tools")
_PRUNE_UNDER = ("numpy", "onnxruntime")


def _cache_root() -> Path:
    return cache_dir() / "lambda-vendor"


def _prune(root: Path) -> None:
    for top in _PRUNE_UNDER:
        base = root / top
        if not base.is_dir():
            continue
        for d in sorted(base.rglob("*"), reverse=True):
            if d.is_dir() and d.name in _PRUNE_DIRS and not (d.name == "tools" and top == "numpy"):
                shutil.rmtree(d, ignore_errors=True)
    for p in root.glob("bin"):
        shutil.rmtree(p, ignore_errors=True)


def vendor_dependencies(dest: Path, *, runtime: str = "python3.11", extra: tuple[str, ...] = (),
                        use_cache: bool = True, timeout_s: float = 900.0) -> Path:
    """Install the runtime's wheels (plus ``extra`` pure-Python requirements, e.g. ``redis``) into ``dest``.

    Raises :class:`VendorError` naming pip's complaint when a wheel is not to be had (no network, no
    wheel for that platform).
    """
    try:
        target = RUNTIMES[runtime]
    except KeyError:
        raise ValueError(f"no wheel target for Lambda runtime {runtime!r}; use one of {sorted(RUNTIMES)}") from None
    reqs = (*target.requirements, *extra)
    key = hashlib.sha256(repr((runtime, target, reqs)).encode()).hexdigest()[:16]
    cached = _cache_root() / f"{runtime}-{key}"
    if not (use_cache and (cached / ".complete").is_file()):
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
               "--target", str(tmp), "--only-binary=:all:", "--implementation", "cp",
               "--python-version", target.python_version, "--no-deps"]
        for p in target.platforms:
            cmd += ["--platform", p]
        cmd += list(reqs)
        log.info("vendoring %s for %s: %s", ", ".join(reqs), runtime, " ".join(cmd))
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S603
        except subprocess.TimeoutExpired as e:
            raise VendorError(f"pip did not install {', '.join(reqs)} for {runtime} within {timeout_s:.0f} s") from e
        if res.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = (res.stderr or res.stdout).strip().splitlines()[-6:]
            raise VendorError(
                f"pip could not install {', '.join(reqs)} as {', '.join(target.platforms)} wheels for Python "
                f"{target.python_version} ({runtime}):\n  " + "\n  ".join(tail)
                + "\nThe package index must be reachable (or hold those wheels); or render with --no-vendor "
                  "and add the dependencies yourself (e.g. a Lambda layer)."
            )
        _prune(tmp)
        (tmp / ".complete").write_text(" ".join(reqs) + "\n")
        shutil.rmtree(cached, ignore_errors=True)
        cached.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, cached)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(cached, dest, ignore=shutil.ignore_patterns(".complete"))
    return dest
