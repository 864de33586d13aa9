"""What the platform knows about a registered function."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FunctionSpec", "check_name"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,140}")

Handler = Literal["master", "worker"]
_HANDLERS: tuple[Handler, ...] = ("master", "worker")


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"function name {name!r} is not valid: letters, digits, '-' and '_', 1-140 characters")
    return name


@dataclass(frozen=True)
class FunctionSpec:
    """A function on the local platform.

    ``env`` is the function's environment (the ``FLATPACK_*`` configuration the deployer renders; the
    platform takes only the names :mod:`serving.platform.env_policy` allows); the platform adds
    ``FLATPACK_BUNDLE_DIR`` (from ``bundle_dir``, which must be a bundle the platform took in:
    :mod:`serving.platform.bundles`), ``FLATPACK_MEMORY_MB`` and ``FLATPACK_INTRA_OP_THREADS`` (from the
    memory size through the profile). ``handler`` says which
    role the function plays (informational: one runtime serves both). ``concurrency``: most instances
    at once (None: the platform default). ``timeout_s``: limit of one invocation (None: default).
    ``queue_timeout_s``: how long a request that finds all ``concurrency`` instances busy waits for one
    before it is throttled (429); None: up to ``timeout_s``; 0: at once, as Lambda throttles a
    synchronous invocation.
    ``vcpu``: the function's CPU (its request and limit, in vCPUs) on a platform whose profile sells CPU
    per function (``cpu: {model: per_function}``, OpenFaaS); None: the profile's ``default_vcpu``. Where
    CPU follows memory (Lambda) a function has no CPU setting of its own, and the platform refuses one.
    ``backend`` picks the interpreter its instances run under, as a Lambda runtime picks an image
    (``onnxruntime``: the platform's own; ``mxnet``: the cached MXNet environment, see
    :mod:`serving.platform.runtimes`); the function's ``FLATPACK_BACKEND`` should say the same.
    """

    name: str
    memory_mb: int
    bundle_dir: str | None = None
    handler: Handler = "worker"
    env: Mapping[str, str] = field(default_factory=dict)
    concurrency: int | None = None
    timeout_s: float | None = None
    backend: str = "onnxruntime"
    queue_timeout_s: float | None = None
    vcpu: float | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.backend not in ("onnxruntime", "mxnet"):
            raise ValueError(f"function {self.name}: backend must be 'onnxruntime' or 'mxnet', got {self.backend!r}")
        if self.memory_mb <= 0:
            raise ValueError(f"function {self.name}: memory_mb must be positive, got {self.memory_mb}")
        _handler(self.name, self.handler)
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"function {self.name}: concurrency must be at least 1")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"function {self.name}: timeout_s must be positive, got {self.timeout_s}")
        if self.queue_timeout_s is not None and not self.queue_timeout_s >= 0:
            raise ValueError(f"function {self.name}: queue_timeout_s must be >= 0, got {self.queue_timeout_s}")
        if self.vcpu is not None and not (isinstance(self.vcpu, int | float) and math.isfinite(self.vcpu)
                                          and self.vcpu > 0):
            raise ValueError(f"function {self.name}: vcpu must be a positive number of vCPUs, got {self.vcpu!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "memory_mb": self.memory_mb,
            "bundle_dir": self.bundle_dir,
            "handler": self.handler,
            "env": dict(self.env),
            "concurrency": self.concurrency,
            "timeout_s": self.timeout_s,
            "backend": self.backend,
            "queue_timeout_s": self.queue_timeout_s,
            "vcpu": self.vcpu,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, name: str | None = None) -> FunctionSpec:
        """The spec a registration's JSON describes (a function's description from the platform too: what
        the platform added is ignored). Raises ValueError for a key it does not know (an interpreter or a
        command cannot be smuggled in under a new name) or a malformed value."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a function spec is a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - _KEYS - _DESCRIBED)
        if unknown:
            raise ValueError(f"function spec has unknown field(s) {unknown}; known: {sorted(_KEYS)}")
        env = d.get("env") or {}
        if not isinstance(env, Mapping):
            raise ValueError(f"function spec's env must be an object of strings, got {type(env).__name__}")
        try:
            name = str(name or d["name"])
            return cls(
                name=name,
                memory_mb=int(d["memory_mb"]),
                bundle_dir=None if d.get("bundle_dir") is None else str(d["bundle_dir"]),
                handler=_handler(name, str(d.get("handler", "worker"))),
                env={str(k): str(v) for k, v in env.items()},
                concurrency=None if d.get("concurrency") is None else int(d["concurrency"]),
                timeout_s=None if d.get("timeout_s") is None else float(d["timeout_s"]),
                backend=str(d.get("backend") or "onnxruntime"),
                queue_timeout_s=None if d.get("queue_timeout_s") is None else float(d["queue_timeout_s"]),
                vcpu=_vcpu(d.get("vcpu")),
            )
        except KeyError as e:
            raise ValueError(f"function spec is missing {e}") from e
        except (TypeError, AttributeError, OverflowError) as e:
            raise ValueError(f"malformed function spec: {e}") from e


_KEYS = frozenset({"name", "memory_mb", "bundle_dir", "handler", "env", "concurrency", "timeout_s", "backend",
                   "queue_timeout_s", "vcpu"})
# what the platform adds when it describes a function, ignored when a description is registered back
_DESCRIBED = frozenset({"instances", "intra_op_threads", "share_vcpu"})


def _vcpu(value: object) -> float | None:
    """A spec's ``vcpu``: None, or a number (a JSON bool or string is refused, not coerced)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"function spec's vcpu must be a number of vCPUs, got {value!r}")
    return float(value)


def _handler(function: str, value: object) -> Handler:
    if value not in _HANDLERS:
        raise ValueError(f"function {function}: handler must be 'master' or 'worker', got {value!r}")
    return value
