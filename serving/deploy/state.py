"""Deployment records: what `flatpack deploy` started, so `ls`, `status`, `invoke` and `undeploy` find it.

One JSON file per deployment under ``$FLATPACK_STATE_DIR`` (default ``~/.local/state/flatpack``), written
atomically, private to the user (0600).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from functions.procstat import pid_alive
from functions.settings import state_dir

__all__ = ["DeploymentRecord", "NAME_RE", "state_dir"]

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")


@dataclass
class DeploymentRecord:
    name: str
    model: str
    bundle: str
    target: str = "local"
    transport: str = "shm"
    mode: str = "lo"
    host: str = "127.0.0.1"
    port: int = 8080
    pid: int | None = None  # the process serving the endpoint and hosting the platform
    endpoint: str | None = None
    platform_url: str | None = None
    deployment_id: str | None = None
    status: str = "starting"  # starting | ready | failed | stopped
    error: str | None = None
    created: float = field(default_factory=time.time)
    predicted: dict[str, Any] = field(default_factory=dict)
    functions: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def path_of(name: str) -> Path:
        return state_dir() / "deployments" / f"{name}.json"

    @property
    def path(self) -> Path:
        return self.path_of(self.name)

    def save(self) -> None:
        p = self.path
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=1)
        os.replace(tmp, p)

    @classmethod
    def load(cls, name: str) -> DeploymentRecord:
        p = cls.path_of(name)
        if not p.is_file():
            raise LookupError(f"no deployment named {name!r}; `flatpack ls` lists them")
        data = json.loads(p.read_text())
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def all(cls) -> list[DeploymentRecord]:
        d = state_dir() / "deployments"
        out = []
        for p in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                out.append(cls.load(p.stem))
            except (LookupError, json.JSONDecodeError, TypeError):
                continue
        return out

    def alive(self) -> bool:
        """Whether the serving process runs (a zombie awaiting its parent's wait() counts as gone)."""
        return self.pid is not None and self.pid > 0 and pid_alive(self.pid)

    def running(self) -> bool:
        """Local deployments run while their serving process lives; cloud ones until undeployed."""
        return self.alive() if self.target == "local" else self.status == "ready"

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)

    def terminate(self, timeout_s: float = 30.0) -> bool:
        """Ask the serving process to stop (SIGTERM: it undeploys cleanly), SIGKILL its group if it lingers."""
        if not self.alive():
            return True
        assert self.pid is not None
        os.kill(self.pid, signal.SIGTERM)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not self.alive():
                return True
            time.sleep(0.05)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return not self.alive()
