"""Configuration of the local platform, with ``FLATPACK_PLATFORM_*`` environment overrides."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

__all__ = ["PlatformConfig"]


@dataclass(frozen=True)
class PlatformConfig:
    """The local platform's settings.

    Parameters
    ----------
    host, port: where the HTTP API listens (127.0.0.1 unless told otherwise; port 0 picks a free one).
    profile: platform profile name or YAML path: the platform it emulates (its CPU model, CPU that follows
        memory or is set per function; billing granularity, payload limit).
    idle_timeout_s: an instance idle this long is reaped (the next request to it is a cold start).
    default_concurrency: instance limit of a function registered without one (None: the profile's
        ``max_concurrency``).
    function_timeout_s: default per-invocation time limit of a function (Lambda's "timeout").
    memory_poll_ms: how often a busy instance's resident memory is checked against its limit, where no memory
        cgroup holds it to its size (with one, the kernel does; each instance's peak is checked after every
        request either way).
    init_timeout_s: how long an instance may take to start (import, load its parts).
    shm_dir: shared-memory root swept of stale tensors every ``sweep_interval_s``, files older than
        ``shm_max_age_s``.
    python: interpreter that runs instances.
    zygote: start onnxruntime instances by forking them from a process that imported numpy and onnxruntime
        once (:mod:`serving.platform.zygote`): a start then costs the host a fraction of the CPU a new
        interpreter does. False: every instance is a new process.
    state_dir: where the platform keeps its own state directory, ``platforms/<port>/`` (its token file and
        the bundles its functions run); None: flatpack's (``$FLATPACK_STATE_DIR``). Clients look for the
        token under flatpack's, so set this only for a platform whose clients are given the token.
    cpu_limit: how an instance gets the CPU its memory buys (see :mod:`serving.platform.cpu`): ``auto``
        (cgroup v2, else v1, else dilation), ``cgroup``, ``cgroup-v2``, ``cgroup-v1``, ``dilation`` or
        ``off`` (whole threads, no limit: the model the planner assumes no longer holds).
    """

    host: str = "127.0.0.1"
    port: int = 8808
    profile: str = "local"
    idle_timeout_s: float = 300.0
    default_concurrency: int | None = None
    function_timeout_s: float = 60.0
    memory_poll_ms: float = 10.0
    init_timeout_s: float = 60.0
    shm_dir: Path = Path("/dev/shm/flatpack")  # noqa: S108 - the shared tmpfs is the point
    sweep_interval_s: float = 30.0
    shm_max_age_s: float = 900.0
    python: str = sys.executable
    cpu_limit: str = "auto"
    zygote: bool = True
    state_dir: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> PlatformConfig:
        """Defaults, then ``FLATPACK_PLATFORM_<FIELD>`` variables (an empty one is unset, as for every
        ``FLATPACK_*`` setting), then ``overrides`` (None ones skipped)."""
        env = os.environ if environ is None else environ
        cfg = cls()
        # field name -> a value of that field's type (converted below, overrides as given): no annotation
        # can say that per key, as for FunctionConfig.from_env's kwargs
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = f"FLATPACK_PLATFORM_{f.name.upper()}"
            raw = (env.get(var) or "").strip()
            if not raw:
                continue
            current = getattr(cfg, f.name)
            try:
                if isinstance(current, bool):
                    values[f.name] = raw.lower() in ("1", "true", "yes")
                elif isinstance(current, int) or f.name == "default_concurrency":
                    values[f.name] = int(raw)
                elif isinstance(current, float):
                    values[f.name] = float(raw)
                elif isinstance(current, Path) or f.name == "state_dir":
                    values[f.name] = Path(raw)
                else:
                    values[f.name] = raw
            except ValueError as e:
                raise ValueError(f"{var}={raw!r} is not a valid {type(current).__name__}") from e
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cfg, **values)
