"""Running an ASGI app with uvicorn on a loopback socket: in a background thread or in the foreground."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.types import ASGIApp

__all__ = ["AppServer", "bind_socket", "url_of"]


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket. IPPROTO_TCP (not 0) so asyncio sets TCP_NODELAY on accepted connections;
    without it a response written as headers + body can wait ~40 ms for a delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e}; pick another port with --port") from e
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class AppServer:
    """``with AppServer(app) as s: urlopen(s.url + "/v2")`` — the app on a loopback port in a thread."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = bind_socket(host, port)
        self.url = url_of(self.sock)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                                                     timeout_keep_alive=75, timeout_graceful_shutdown=5))
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> AppServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                        name="flatpack-api")
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the endpoint did not start on {self.url}")
            time.sleep(0.01)
        return self

    def run(self) -> None:
        """Serve in the foreground until interrupted."""
        self._server.run(sockets=[self.sock])

    def stop(self, timeout_s: float = 30.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.sock.close()

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
