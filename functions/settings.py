"""flatpack's process-wide settings from the environment: one reader per ``FLATPACK_*`` variable.

Every package reads these through this module and nowhere else, so each variable has one default and one
behaviour (the README's settings table lists them). Two rules hold for all of them:

* **an empty value is the same as an unset one** (the default applies), so ``FLATPACK_X= cmd`` never
  means "the current directory" or "no token";
* a value that cannot be used raises ``ValueError`` naming the variable and what it takes.

A function's own configuration (the variables a deployer sets on each function) is read by
:meth:`functions.config.FunctionConfig.from_env`, the local platform's by
``serving.platform.config.PlatformConfig``; those are the only other readers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "API_TOKEN",
    "CACHE_DIR",
    "CPU_SHARE",
    "DEFAULT_REDIS_URL",
    "INVOKE_TOKEN",
    "LOG_LEVEL",
    "OPENFAAS_FUNCTION_GATEWAY",
    "OPENFAAS_IMAGE",
    "REDIS_URL",
    "S3_BUCKET",
    "STATE_DIR",
    "api_token",
    "cache_dir",
    "configured_redis_url",
    "cpu_share",
    "invoke_token",
    "log_level",
    "openfaas_function_gateway",
    "openfaas_image",
    "redis_url",
    "s3_bucket",
    "state_dir",
]

CACHE_DIR = "FLATPACK_CACHE_DIR"
STATE_DIR = "FLATPACK_STATE_DIR"
API_TOKEN = "FLATPACK_API_TOKEN"  # noqa: S105 - the variable's name, not a secret
REDIS_URL = "FLATPACK_REDIS_URL"
LOG_LEVEL = "FLATPACK_LOG_LEVEL"
S3_BUCKET = "FLATPACK_S3_BUCKET"
OPENFAAS_IMAGE = "FLATPACK_OPENFAAS_IMAGE"
OPENFAAS_FUNCTION_GATEWAY = "FLATPACK_OPENFAAS_FUNCTION_GATEWAY"
CPU_SHARE = "FLATPACK_CPU_SHARE"  # set by the local platform on an instance whose CPU share is dilated
INVOKE_TOKEN = "FLATPACK_INVOKE_TOKEN"  # noqa: S105 - the variable's name; set by the local platform on instances

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET")


def _get(name: str, env: Mapping[str, str] | None) -> str | None:
    raw = (os.environ if env is None else env).get(name)
    return raw.strip() or None if raw is not None else None


def _dir(name: str, default: Path, env: Mapping[str, str] | None) -> Path:
    raw = _get(name, env)
    if raw is None:
        return default
    path = Path(raw).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name}={raw!r} is a file, not a directory; point it at a directory (or unset it)")
    return path


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where flatpack keeps what it can rebuild: profiles, calibrations, zoo models, trained
    autoencoders and predictors, backend environments, vendored wheels. ``$FLATPACK_CACHE_DIR``,
    default ``~/.cache/flatpack``."""
    return _dir(CACHE_DIR, Path.home() / ".cache" / "flatpack", env)


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where flatpack keeps what it cannot rebuild: the records of running deployments and of the
    platform started by ``flatpack platform start``. ``$FLATPACK_STATE_DIR``, default
    ``~/.local/state/flatpack`` (XDG's state directory)."""
    return _dir(STATE_DIR, Path.home() / ".local" / "state" / "flatpack", env)


def api_token(env: Mapping[str, str] | None = None) -> str | None:
    """The bearer token an inference endpoint requires, and a client sends (``$FLATPACK_API_TOKEN``);
    None: no authentication."""
    return _get(API_TOKEN, env)


def invoke_token(env: Mapping[str, str] | None = None) -> str | None:
    """The token a local-platform function sends when it invokes other functions there
    (``$FLATPACK_INVOKE_TOKEN``, set by the platform on its instances; it allows invocations only)."""
    return _get(INVOKE_TOKEN, env)


def configured_redis_url(env: Mapping[str, str] | None = None) -> str | None:
    """The Redis server ``$FLATPACK_REDIS_URL`` names, or None (a cloud deployment then uses no Redis)."""
    url = _get(REDIS_URL, env)
    if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"{REDIS_URL}={url!r} is not a redis://, rediss:// or unix:// URL")
    return url


def redis_url(env: Mapping[str, str] | None = None) -> str:
    """The Redis server of the redis transport when no flag names one: ``$FLATPACK_REDIS_URL``, default
    this machine's (``redis://127.0.0.1:6379/0``)."""
    return configured_redis_url(env) or DEFAULT_REDIS_URL


def s3_bucket(env: Mapping[str, str] | None = None) -> str | None:
    """An existing S3 bucket for a cloud deployment's tensors and large parts (``$FLATPACK_S3_BUCKET``);
    None: the deployer creates one."""
    return _get(S3_BUCKET, env)


def openfaas_image(env: Mapping[str, str] | None = None) -> str | None:
    """The image OpenFaaS functions run (``$FLATPACK_OPENFAAS_IMAGE``); None: the stack builds its own."""
    return _get(OPENFAAS_IMAGE, env)


def openfaas_function_gateway(env: Mapping[str, str] | None = None) -> str | None:
    """The gateway URL the functions themselves invoke workers through, when it differs from the one
    flatpack deploys through (``$FLATPACK_OPENFAAS_FUNCTION_GATEWAY``)."""
    return _get(OPENFAAS_FUNCTION_GATEWAY, env)


def log_level(default: str | int = "WARNING", env: Mapping[str, str] | None = None) -> str | int:
    """The logging level (``$FLATPACK_LOG_LEVEL``: a level name such as ``INFO``), else ``default``."""
    raw = _get(LOG_LEVEL, env)
    if raw is None:
        return default
    level = raw.upper()
    if level not in _LEVELS:
        raise ValueError(f"{LOG_LEVEL}={raw!r} is not a logging level; use one of {', '.join(_LEVELS)}")
    return level


def cpu_share(env: Mapping[str, str] | None = None) -> float | None:
    """The share of a core a local-platform instance emulates by dilation (None: not dilated)."""
    raw = _get(CPU_SHARE, env)
    if raw is None:
        return None
    try:
        share = float(raw)
    except ValueError:
        share = -1.0
    if not share > 0:
        raise ValueError(f"{CPU_SHARE}={raw!r}: give a positive share of a core (e.g. 0.29)")
    return share
