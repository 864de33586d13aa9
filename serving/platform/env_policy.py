"""Which environment variables a registration may give a function on the local platform: an allow-list.

A function instance runs the platform's interpreter, as the platform's user, on a bundle the platform
checked. Its environment must not be able to change that: a ``PYTHONPATH``, ``PYTHONSTARTUP``,
``LD_PRELOAD`` or ``LD_LIBRARY_PATH`` in a request would make the instance run whatever code the requester
names. So a request's ``env`` may hold only

* the ``FLATPACK_*`` settings the function runtime reads (:class:`functions.config.FunctionConfig`'s
  variables and ``FLATPACK_LOG_LEVEL``), less those the platform sets itself (:data:`PLATFORM_SET`);
* the further names the platform's profile declares under ``function_env`` (a list in its YAML) — never a
  loader, interpreter or library-path variable (:func:`is_loader_variable`).

Anything else is refused with a ValueError naming the variable (the HTTP API answers 400).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import fields

from functions import settings
from functions.config import FunctionConfig

__all__ = ["PLATFORM_SET", "EnvPolicy", "is_loader_variable", "runtime_variables"]

#: set on every instance by the platform itself; a request may not set them
PLATFORM_SET = frozenset({
    "FLATPACK_BUNDLE_DIR",  # from the registration's checked bundle_dir
    "FLATPACK_MEMORY_MB",  # from memory_mb, the limit the platform enforces
    settings.CPU_SHARE,  # from the CPU limiter
    settings.INVOKE_TOKEN,  # the platform's invoke-only token
})

# variables that choose the code a process loads: interpreters' search paths and start-up hooks, the
# dynamic loader's, and other runtimes' (a function runs Python, but a subprocess it starts might not)
_LOADER = re.compile(
    r"PYTHON.*|LD_.*|DYLD_.*|PATH|IFS|BASH_ENV|ENV|SHELLOPTS|PS4|PERL5?LIB|PERL5OPT|RUBYLIB|RUBYOPT|"
    r"NODE_OPTIONS|NODE_PATH|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS|GCONV_PATH|LOCPATH|NLSPATH|HOSTALIASES|"
    r"MALLOC_.*|GLIBC_TUNABLES|TMPDIR|HOME|OPENSSL_CONF|OPENSSL_ENGINES|SSL_CERT_.*|CUDA_.*|ORT_.*|"
    r"MXNET_LIBRARY_PATH|OMP_.*|KMP_.*|MKL_.*|OPENBLAS_.*",
    re.IGNORECASE,
)
# FunctionConfig variables the local platform refuses when non-empty (a deployer sends each, empty ones too)
_NOT_ON_THIS_PLATFORM = {"FLATPACK_BUNDLE_S3_URI": "the local platform runs bundles it took in, never one fetched "
                                                   "from S3 at start"}


def is_loader_variable(name: str) -> bool:
    """Whether ``name`` chooses the code or libraries a process loads (or how many threads the platform
    gave it): never taken from a request, nor declared by a profile."""
    return bool(_LOADER.fullmatch(name))


def runtime_variables() -> frozenset[str]:
    """The ``FLATPACK_*`` settings a function's runtime reads (:meth:`FunctionConfig.from_env` and the
    runtime-wide ``FLATPACK_LOG_LEVEL``), less :data:`PLATFORM_SET`."""
    names = {f"FLATPACK_{f.name.upper()}" for f in fields(FunctionConfig)} | {settings.LOG_LEVEL}
    return frozenset(names - PLATFORM_SET)


class EnvPolicy:
    """The allow-list of one platform: :func:`runtime_variables` plus ``declared`` (its profile's
    ``function_env``).

    Raises:
        ValueError: ``declared`` names a loader variable, one the platform sets, or a malformed name.
    """

    def __init__(self, declared: Iterable[str] = ()) -> None:
        extra = set()
        for name in declared:
            name = str(name)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"the profile's function_env names {name!r}, which is not a variable name")
            if is_loader_variable(name) or name in PLATFORM_SET:
                raise ValueError(f"the profile's function_env names {name}, which a function may not be given: "
                                 f"it chooses the code an instance loads or is set by the platform; remove it")
            extra.add(name)
        self.declared = frozenset(extra)
        self.allowed = runtime_variables() | self.declared

    def check(self, function: str, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` if every variable in it is allowed; else ValueError naming the first one that is not."""
        for name in sorted(env):
            value = env[name]
            if is_loader_variable(name):
                raise ValueError(
                    f"function {function}: env variable {name} is refused: it chooses the code or libraries the "
                    f"instance loads, which only the platform sets. A function's env may hold flatpack's "
                    f"FLATPACK_* settings and the names its profile declares under function_env")
            if name in PLATFORM_SET:
                raise ValueError(f"function {function}: env variable {name} is set by the platform (from the "
                                 f"registration's bundle_dir and memory_mb, and its own CPU limit and token); "
                                 f"leave it out")
            if name in _NOT_ON_THIS_PLATFORM and value.strip():
                raise ValueError(f"function {function}: env variable {name} is refused: "
                                 f"{_NOT_ON_THIS_PLATFORM[name]}")
            if name not in self.allowed:
                raise ValueError(
                    f"function {function}: env variable {name} is not a setting a function reads on this platform; "
                    f"allowed: flatpack's FLATPACK_* function settings"
                    + (f" and {', '.join(sorted(self.declared))}" if self.declared else "")
                    + " (a profile may declare more under function_env)")
        return dict(env)
