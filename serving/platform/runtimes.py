"""The interpreter each backend's functions run under on the local platform.

``onnxruntime`` functions run under the platform's own interpreter (``PlatformConfig.python``). ``mxnet``
functions run under a virtual environment flatpack creates and caches, as a cloud function has its own
image: MXNet 1.9 needs numpy < 1.24, which flatpack's own dependencies (scipy, onnx) do not allow. The
environment lives in ``$FLATPACK_CACHE_DIR/backends/mxnet-<key>`` (default ``~/.cache/flatpack``), keyed by
the requirements file (``functions/backends/mxnet-requirements.txt``) and the Python version, so a
change of either makes a new one. The ``functions`` package is not installed into it: the platform puts
the project on ``PYTHONPATH`` for every instance, so instances always run the code of this checkout.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import functions
from functions.backends import DEFAULT_BACKEND, check_backend
from functions.filelock import exclusive
from functions.settings import cache_dir

__all__ = [
    "BackendEnv",
    "BackendEnvError",
    "backend_env",
    "backend_python",
    "ensure_backend_env",
    "project_pythonpath",
    "require_backend",
    "requirements_file",
]

log = logging.getLogger(__name__)

_PROJECT_ROOT = Path(functions.__file__).resolve().parent.parent


def project_pythonpath(environ: Mapping[str, str] | None = None) -> str:
    """``PYTHONPATH`` for a child process of flatpack's (a function instance, the platform, a benchmark's
    helper): this checkout first, then what the environment had, so the child runs this code."""
    have = (os.environ if environ is None else environ).get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (str(_PROJECT_ROOT), have) if p)
_MARKER = ".flatpack-complete"
# what a ready environment must import (with the project on PYTHONPATH)
_SMOKE = {"mxnet": "import mxnet, onnx, numpy, functions.backends.mxnet; print(mxnet.__version__, numpy.__version__)"}


class BackendEnvError(RuntimeError):
    """A backend's environment is missing or could not be created."""


def requirements_file(backend: str) -> Path:
    """The requirements of ``backend``'s environment (shipped in the functions package)."""
    check_backend(backend)
    return Path(functions.__file__).resolve().parent / "backends" / f"{backend}-requirements.txt"


def _requirements(backend: str) -> list[str]:
    lines = requirements_file(backend).read_text().splitlines()
    return [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]


def _cache_root() -> Path:
    return cache_dir() / "backends"


@dataclass(frozen=True)
class BackendEnv:
    """Where ``backend``'s environment is (or would be) and what goes into it."""

    backend: str
    root: Path
    requirements: tuple[str, ...]
    base_python: str

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def ready(self) -> bool:
        return (self.root / _MARKER).is_file() and self.python.exists()

    def describe(self) -> dict[str, object]:
        return {"backend": self.backend, "path": str(self.root), "ready": self.ready,
                "python": str(self.python), "requirements": list(self.requirements)}


def backend_env(backend: str) -> BackendEnv:
    """The environment of ``backend`` (not created here), made from this interpreter's Python."""
    if check_backend(backend) == DEFAULT_BACKEND:
        raise ValueError(f"{DEFAULT_BACKEND} runs in flatpack's own environment; it has no separate one")
    reqs = tuple(_requirements(backend))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    key = hashlib.sha256(repr((reqs, version)).encode()).hexdigest()[:12]
    return BackendEnv(backend, _cache_root() / f"{backend}-{key}", reqs, sys.executable)


def backend_python(backend: str) -> str:
    """The interpreter ``backend``'s functions run under. Raises BackendEnvError if it is not set up."""
    if check_backend(backend) == DEFAULT_BACKEND:
        return sys.executable
    env = backend_env(backend)
    if not env.ready:
        raise BackendEnvError(
            f"the {backend} backend's environment is not set up (expected at {env.root}); "
            f"create it with `flatpack backend setup {backend}`"
        )
    return str(env.python)


def ensure_backend_env(backend: str, *, progress: Callable[[str], None] | None = None,
                       timeout_s: float = 1800.0) -> BackendEnv:
    """Create ``backend``'s environment unless it is ready; returns it.

    The environment is built next to its final place and moved there only once its smoke test passes
    (``import mxnet`` and the function runtime's MXNet module), under a file lock, so concurrent callers
    build it once and a half-made one is never used. Needs the package index (pip's usual configuration)
    the first time. Raises BackendEnvError with pip's last lines when it fails.
    """
    env = backend_env(backend)
    if env.ready:
        return env
    say = progress or (lambda _m: None)
    with exclusive(env.root.with_name(env.root.name + ".lock")):
        if env.ready:
            return env
        tmp = env.root.with_name(env.root.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.monotonic()
        try:
            say(f"creating the {backend} environment in {env.root} (first time only)")
            _run([env.base_python, "-m", "venv", str(tmp)], timeout_s, "python -m venv")
            say(f"installing {', '.join(env.requirements)} (about 350 MB; a few minutes)")
            _run([str(tmp / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                  "--no-input", "--progress-bar", "off", "-r", str(requirements_file(backend))],
                 max(60.0, timeout_s - (time.monotonic() - t0)), "pip install", progress=say)
            say(f"checking that {backend} imports")
            out = _run([str(tmp / "bin" / "python"), "-c", _SMOKE[backend]], 300.0, f"import {backend}",
                       env={**os.environ, "PYTHONPATH": str(_PROJECT_ROOT)})
            (tmp / _MARKER).write_text(f"{' '.join(env.requirements)}\n{out.strip()}\n")
            shutil.rmtree(env.root, ignore_errors=True)
            # a venv's bin/python and site-packages do not depend on the directory's name (only its
            # console scripts' shebangs do, and flatpack runs `bin/python -m pip`)
            os.replace(tmp, env.root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"{backend} environment ready in {time.monotonic() - t0:.0f} s: {env.root}")
    return env


def _run(cmd: list[str], timeout_s: float, what: str, *, progress: Callable[[str], None] | None = None,
         env: dict[str, str] | None = None) -> str:
    log.info("running %s", " ".join(cmd))
    lines: list[str] = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,  # noqa: S603
                                env=env, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise BackendEnvError(f"{what} could not start: {e}") from e
    end = time.monotonic() + timeout_s
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        lines.append(line)
        if progress and line.startswith(("Collecting", "Downloading", "Installing", "Successfully")):
            progress(line[:160])
        if time.monotonic() > end:
            proc.kill()
            break
    try:
        rc = proc.wait(timeout=max(1.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    if rc != 0:
        tail = "\n  ".join(ln for ln in lines[-8:] if ln)
        why = f"did not finish within {timeout_s:.0f} s" if rc is None or time.monotonic() > end else f"failed ({rc})"
        raise BackendEnvError(
            f"{what} {why}:\n  {tail}\nThe package index must be reachable (pip's usual configuration: "
            f"PIP_INDEX_URL, a proxy) the first time the environment is made"
        )
    return "\n".join(lines)


def require_backend(backend: str, *, bundle: str | Path | None = None, local: bool = True,
                    notice: Callable[[str], None] | None = None,
                    progress: Callable[[str], None] | None = None) -> None:
    """Before running functions with ``backend``: refuse a bundle it cannot run (``bundle``: its directory)
    and, for functions on this machine (``local``), create the backend's environment on first use.
    ``notice`` is told once when that creation starts; ``progress`` gets its steps.

    Raises:
        BackendEnvError: the bundle has parts the backend cannot run (each named), or the environment
            could not be created.
    """
    if backend == DEFAULT_BACKEND:
        return
    if bundle is not None:
        from functions.backends.mxnet_onnx import bundle_problems

        problems = bundle_problems(bundle)
        if problems:
            raise BackendEnvError(f"the {backend} backend cannot run this bundle:\n  " + "\n  ".join(problems)
                                  + "\nRun it with --backend onnxruntime (the default)")
    env = backend_env(backend)
    if env.ready or not local:
        return
    if notice is not None:
        notice(f"the {backend} backend runs in its own environment, which is not set up yet: creating it now "
               f"(once; `flatpack backend setup {backend}` does the same)")
    ensure_backend_env(backend, progress=progress)
