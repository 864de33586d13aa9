"""The local platform in a process of its own, for benchmarks.

A benchmark that runs the platform in a thread of its own process shares the GIL between its load
generator threads and the platform's event loop, which then delays every invocation by whatever the
clients are doing. `flatpack deploy` hosts the platform in the deployment's process, apart from the
clients; the suite and the simulator's validation do the same with :class:`PlatformProcess`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serving.platform.client import PlatformClient, PlatformUnavailable
from serving.platform.parent_death import die_with_parent
from serving.platform.runtimes import project_pythonpath

__all__ = ["PlatformProcess"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PlatformProcess:
    """``python -m serving.platform`` on a free loopback port; stopped (with its instances) on exit.

    ``idle_timeout_s``: instances idle this long are reaped. ``env``: further ``FLATPACK_PLATFORM_*``
    settings (see :class:`serving.platform.config.PlatformConfig`).
    """

    def __init__(self, *, idle_timeout_s: float = 600.0, profile: str = "local", env: dict[str, str] | None = None,
                 start_timeout_s: float = 60.0) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._idle = idle_timeout_s
        self._profile = profile
        self._env = env or {}
        self._timeout = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="flatpack-bench-platform-", suffix=".log", delete=False)  # noqa: SIM115 - closed in stop()

    @property
    def client(self) -> PlatformClient:
        return PlatformClient(self.url, timeout_s=60)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def log_path(self) -> Path:
        return Path(self._log.name)

    def start(self) -> PlatformProcess:
        env = {**os.environ, **self._env}
        env["PYTHONPATH"] = project_pythonpath(env)
        self._proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "serving.platform", "--host", "127.0.0.1", "--port", str(self.port),
             "--profile", self._profile, "--idle-timeout-s", str(self._idle)],
            stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, no locks taken
        )
        end = time.monotonic() + self._timeout
        client = PlatformClient(self.url, timeout_s=2)
        while True:
            if self._proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"the platform exited while starting (code {self._proc.returncode}): {tail}")
            try:
                client.health()
                return self
            except PlatformUnavailable:
                if time.monotonic() > end:
                    self.stop()
                    raise RuntimeError(f"the platform did not answer at {self.url} within {self._timeout:.0f} s; "
                                       f"see {self.log_path}") from None
                time.sleep(0.1)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._proc = None
        self._log.close()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> PlatformProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
