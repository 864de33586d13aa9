"""Running the local platform: in a background thread (tests, ``flatpack run``) or in the foreground
(``python -m serving.platform``, what ``flatpack platform start`` launches)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import uvicorn

from platforms import PlatformProfile
from serving.api.server import bind_socket, url_of
from serving.platform.app import create_app, fast_invocations
from serving.platform.auth import PlatformCredentials, PlatformHome
from serving.platform.client import PlatformClient
from serving.platform.config import PlatformConfig
from serving.platform.service import PlatformService

__all__ = ["LocalPlatform", "serve"]

log = logging.getLogger(__name__)


_bind = bind_socket
_url = url_of


def _home(config: PlatformConfig, sock: socket.socket, credentials: PlatformCredentials) -> PlatformHome:
    """The platform's state directory for the port it holds, made afresh with its token file."""
    return PlatformHome.for_port(int(sock.getsockname()[1]), config.state_dir).create(credentials)


def _server(config: PlatformConfig, profile: PlatformProfile | None, sock: socket.socket,
            credentials: PlatformCredentials, home: PlatformHome) -> tuple[uvicorn.Server, PlatformService]:
    app = create_app(config, profile, credentials=credentials, home=home)
    service: PlatformService = app.state.service
    service.url = _url(sock)
    ucfg = uvicorn.Config(fast_invocations(app), log_level="warning", lifespan="on", timeout_keep_alive=75,
                          timeout_graceful_shutdown=5, access_log=False)
    return uvicorn.Server(ucfg), service


class LocalPlatform:
    """The local platform in a background thread of this process.

    ``with LocalPlatform(PlatformConfig(port=0)) as p: p.client.register(...)``; :attr:`url` is known as
    soon as the object exists (the socket is bound in the constructor), and so is :attr:`token` (written
    to :attr:`token_file`, readable by this user only, where other clients of this user find it).
    """

    def __init__(self, config: PlatformConfig | None = None, profile: PlatformProfile | None = None) -> None:
        self.config = config or PlatformConfig(port=0)
        self._sock = _bind(self.config.host, self.config.port)
        self.url = _url(self._sock)
        self._credentials = PlatformCredentials()
        try:
            self._home = _home(self.config, self._sock, self._credentials)
            self._server, self._service = _server(self.config, profile, self._sock, self._credentials, self._home)
        except BaseException:
            self._sock.close()
            raise
        self._thread: threading.Thread | None = None

    @property
    def token(self) -> str:
        """The platform's token (every route but ``/healthz`` requires it)."""
        return self._credentials.token

    @property
    def token_file(self) -> Path:
        return self._home.token_file

    @property
    def service(self) -> PlatformService:
        return self._service

    @property
    def client(self) -> PlatformClient:
        return PlatformClient(self.url, token=self.token)

    def start(self, timeout_s: float = 30.0) -> LocalPlatform:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="flatpack-platform", daemon=True)
        self._thread.start()
        t_end = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the local platform at {self.url} stopped while starting")
            if time.monotonic() > t_end:
                raise TimeoutError(f"the local platform at {self.url} did not start within {timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout_s)
            self._thread = None
        self._sock.close()
        self._home.remove(self._credentials)

    def __enter__(self) -> LocalPlatform:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(config: PlatformConfig, profile: PlatformProfile | None = None) -> None:
    """Run the platform in the foreground until SIGINT / SIGTERM (instances are stopped on the way out)."""
    sock = _bind(config.host, config.port)
    credentials = PlatformCredentials()
    home = _home(config, sock, credentials)
    try:
        server, _ = _server(config, profile, sock, credentials, home)
        log.warning("flatpack local platform listening on %s (profile %s); its token is in %s", _url(sock),
                    config.profile, home.token_file)
        server.run(sockets=[sock])
    finally:
        home.remove(credentials)
