"""Which local platform a calibration measures: the one already running, or one embedded for the run.

A running platform is found at the URL given, else the one `flatpack platform start` recorded (its state
file), else at the configured address (``FLATPACK_PLATFORM_HOST`` / ``FLATPACK_PLATFORM_PORT``, default
127.0.0.1:8808). If none answers, one is started in this process for the run and stopped after it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from functions.settings import state_dir
from serving.platform.client import PlatformClient, PlatformUnavailable
from serving.platform.config import PlatformConfig

__all__ = ["PlatformTarget", "local_platform"]

_STATE_FILE = "platform.json"  # what `flatpack platform start` writes in the state directory (serving.cli.platform)
_PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class PlatformTarget:
    """A local platform to measure: its client and URL, whether this run started it, the profile it
    runs, and where its shared memory lives (None: the functions' default)."""

    client: PlatformClient
    url: str
    embedded: bool
    profile: str
    shm_dir: Path | None = None


def _recorded_url() -> str | None:
    try:
        return str(json.loads((state_dir() / _STATE_FILE).read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _answering(url: str) -> str | None:
    """The profile the platform at ``url`` runs, or None if nothing answers there."""
    try:
        return str(PlatformClient(url, timeout_s=_PROBE_TIMEOUT_S).health().get("profile") or "")
    except (PlatformUnavailable, ValueError):
        return None


@contextlib.contextmanager
def local_platform(profile: str | Path = "local", *, url: str | None = None,
                   config: PlatformConfig | None = None) -> Iterator[PlatformTarget]:
    """The local platform to calibrate (see the module docstring). ``url``: use the platform there and no
    other (ConnectionError if it does not answer). ``config``: the embedded platform's settings (default:
    ``PlatformConfig.from_env`` on a free port running ``profile``)."""
    if url is not None:
        running = _answering(url)
        if running is None:
            raise PlatformUnavailable(f"no local platform answers at {url}; start one with `flatpack platform start` "
                                      f"or leave out --url to calibrate one started for the run")
        yield PlatformTarget(PlatformClient(url), url, False, running)
        return
    seen: set[str] = set()
    for candidate in (_recorded_url(), _configured_url()):
        if candidate is None or candidate in seen:
            continue
        seen.add(candidate)
        running = _answering(candidate)
        if running is not None:
            yield PlatformTarget(PlatformClient(candidate), candidate, False, running)
            return
    from serving.platform.server import LocalPlatform

    cfg = config or PlatformConfig.from_env(port=0, profile=str(profile))
    with LocalPlatform(cfg) as p:
        yield PlatformTarget(p.client, p.url, True, str(p.client.health().get("profile") or ""), cfg.shm_dir)


def _configured_url() -> str:
    cfg = PlatformConfig.from_env()
    return f"http://{cfg.host}:{cfg.port}"
