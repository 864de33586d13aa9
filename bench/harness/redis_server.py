"""A Redis for a benchmark: one that answers already, or a ``redis-server`` of the benchmark's own.

:class:`OwnRedis` is a server this process starts on a free loopback port with no persistence (so a
benchmark may restart it without touching anyone else's Redis); :func:`available_redis` yields the first
of some candidate URLs a server answers at, else an :class:`OwnRedis` for the block, else None.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["OwnRedis", "available_redis", "free_port", "redis_answers"]


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_answers(url: str, *, timeout_s: float = 0.5) -> bool:
    """Whether a Redis answers a PING at ``url`` (False too without the redis client)."""
    try:
        import redis
    except ImportError:
        return False
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=2 * timeout_s).ping())
    except (redis.exceptions.RedisError, OSError):
        return False


class OwnRedis:
    """A ``redis-server`` this process started on a free loopback port, with no persistence."""

    def __init__(self, workdir: Path, *, password: str | None = None) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise FileNotFoundError("redis-server is not on PATH; install it (apt-get install redis-server) or use "
                                    "--transport shm")
        self._server = server
        self._dir = workdir
        self.port = free_port()
        self._password = password
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> OwnRedis:
        argv = [self._server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self._dir)]
        if self._password:
            argv += ["--requirepass", self._password]
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
        self._wait(timeout_s)
        return self

    def _wait(self, timeout_s: float) -> None:
        t_end = time.monotonic() + timeout_s
        while not redis_answers(self.url, timeout_s=0.2):
            if time.monotonic() > t_end:
                raise RuntimeError(f"the redis-server started on port {self.port} does not answer")
            time.sleep(0.02)

    def restart(self) -> float:
        """Stop the server (SIGTERM) and start it again on the same port; seconds it was away."""
        t0 = time.perf_counter()
        self.stop()
        self.start()
        self.restarts += 1
        return time.perf_counter() - t0

    def keys(self) -> int:
        import redis

        return int(redis.Redis.from_url(self.url).dbsize())

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
            self._proc = None


@contextmanager
def available_redis(*candidates: str | None, start_timeout_s: float = 5.0) -> Iterator[str | None]:
    """The first of ``candidates`` (None ones skipped) a Redis answers at; else a ``redis-server`` started for
    the block (and stopped after it); else None (no server on PATH, no redis client, or it did not answer)."""
    for url in candidates:
        if url and redis_answers(url):
            yield url
            return
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-redis-") as tmp:
        try:
            own: OwnRedis | None = OwnRedis(Path(tmp)).start(start_timeout_s)
        except (FileNotFoundError, RuntimeError, ImportError):
            own = None
        try:
            yield own.url if own is not None else None
        finally:
            if own is not None:
                own.stop()
