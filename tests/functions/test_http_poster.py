"""The invokers' HTTP client against a real HTTP/1.1 server on a loopback port: keep-alive reuse, bodies framed
by Content-Length, chunks or the connection's close, a kept-alive connection the server dropped, and
timeouts and unreachable servers as structured errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from functions.errors import InvokeError, InvokeTimeout
from functions.invoker.http import HttpPoster


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((self.path, dict(self.headers), body))
        mode = self.path.rsplit("/", 1)[-1]
        if mode == "slow":
            self.server.release.wait(10)
        if mode == "chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("X-Thing", "a")
            self.send_header("X-Thing", "b")
            self.end_headers()
            for piece in (body[:3], body[3:]):
                self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\nTrailer: t\r\n\r\n")
            return
        if mode == "close":  # no length: the body ends with the connection
            self.wfile.write(b"HTTP/1.1 201 Created\r\nConnection: close\r\n\r\n" + body[::-1])
            self.close_connection = True
            return
        if mode == "continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if mode == "drop":  # answers, then closes the kept-alive connection while it idles
            self.close_connection = True
        self.send_response(404 if mode == "missing" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.connections = 0
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/base"


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.release.set()
    s.shutdown()
    s.server_close()
    t.join(5)


def test_posts_reuse_one_connection_and_return_status_headers_and_body(server: _Server) -> None:
    p = HttpPoster(server.url)
    payload = bytes(range(256)) * 1000
    for i in range(3):
        status, headers, body = p.post("/ok", payload + bytes([i]), timeout_s=5, headers={"X-Flatpack-Token": "t"})
        assert status == 200 and body == payload + bytes([i])
        assert headers["content-type"] == "application/octet-stream"
    assert server.connections == 1
    path, sent, _ = server.seen[0]
    assert path == "/base/ok" and sent["X-Flatpack-Token"] == "t"
    assert p.post("/missing", b"x", timeout_s=5)[0] == 404
    p.close()


def test_chunked_close_delimited_and_informational_responses(server: _Server) -> None:
    p = HttpPoster(server.url)
    status, headers, body = p.post("/chunked", b"hello world", timeout_s=5)
    assert (status, body, headers["x-thing"]) == (200, b"hello world", "a, b")
    assert p.post("/continue", b"after 100", timeout_s=5)[::2] == (200, b"after 100")
    status, _, body = p.post("/close", b"abc", timeout_s=5)
    assert (status, body) == (201, b"cba")
    assert p.post("/ok", b"again", timeout_s=5)[2] == b"again"  # on a new connection
    assert server.connections == 2
    p.close()


def test_a_connection_the_server_closed_is_replaced_once(server: _Server) -> None:
    p = HttpPoster(server.url)
    assert p.post("/drop", b"1", timeout_s=5)[2] == b"1"
    assert p.post("/ok", b"2", timeout_s=5)[2] == b"2"
    assert server.connections == 2
    p.close()


def test_timeouts_and_unreachable_servers_are_structured_errors(server: _Server) -> None:
    p = HttpPoster(server.url)
    with pytest.raises(InvokeTimeout, match="within 0.2 s"):
        p.post("/slow", b"x", timeout_s=0.2, what="function f")
    server.release.set()
    assert p.post("/ok", b"fresh", timeout_s=5)[2] == b"fresh"  # the timed-out connection was dropped
    p.close()
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    with pytest.raises(InvokeError, match="cannot reach"):
        HttpPoster(f"http://127.0.0.1:{port}").post("/ok", b"x", timeout_s=2)
    with pytest.raises(ValueError, match="http"):
        HttpPoster("ftp://example.com")


def test_requests_sent_from_one_thread_are_answered_to_the_threads_that_wait_for_them(server: _Server) -> None:
    """A master sends a stage's invocations one after another from its own thread, then waits for each in
    another: every request is on the wire before send returns, and each waiter gets its own reply."""
    p = HttpPoster(server.url)
    replies = [p.send("/slow", b"part %d" % i, timeout_s=10) for i in range(4)]

    def all_arrived() -> bool:
        with server.lock:
            return len(server.seen) == 4

    deadline = time.monotonic() + 10
    while not all_arrived():  # every request reached the server while none has been answered
        assert time.monotonic() < deadline, f"only {len(server.seen)} of 4 requests reached the server"
        time.sleep(0.01)
    assert server.connections == 4
    server.release.set()
    with ThreadPoolExecutor(4) as pool:
        bodies = list(pool.map(lambda reply: reply()[2], replies))
    assert bodies == [b"part %d" % i for i in range(4)]
    # the four connections are idle again, and reused
    assert [p.post("/ok", b"%d" % i, timeout_s=5)[2] for i in range(4)] == [b"0", b"1", b"2", b"3"]
    assert server.connections == 4
    p.close()
