"""Keep-alive HTTP POSTs from many threads, standard library only.

A master pays for every invocation with its own CPU, and at 512 MB a function has 0.29 of a core: the
standard library's ``http.client`` parses each response's headers through the ``email`` package, which
took about a third of a master's CPU per worker invocation. So plain ``http://`` URLs (the local platform,
an OpenFaaS gateway inside the cluster) go through :class:`_PlainConnection`, a small HTTP/1.1 client on
a socket: one ``sendmsg`` per request (head and body, no copy of the body), the status line and headers
split as bytes, bodies framed by ``Content-Length`` or chunked (or read to the close). ``https://`` URLs
keep ``http.client`` (TLS, proxies and their corner cases are not worth owning).
"""

from __future__ import annotations

import functools
import http.client
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from functions.codec import advance_views
from functions.errors import InvokeError, InvokeTimeout

__all__ = ["HttpPoster"]

_MAX_HEAD = 64 * 1024  # a response head longer than this is not from a server we talk to


class _ProtocolError(OSError):
    """The server's reply is not HTTP/1.x as this client reads it."""


class _PlainConnection:
    """One keep-alive HTTP/1.1 connection over TCP (no TLS)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.sock: socket.socket | None = None
        self._buf = bytearray()  # bytes read past the last response

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None
                self._buf.clear()

    def send_request(self, path: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        """Write one request (the socket's timeout, ``timeout_s``, also bounds reading its response)."""
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self.sock
        sock.settimeout(timeout_s)
        lines = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        _send_all(sock, head, body)

    def read_response(self) -> tuple[int, dict[str, str], bytes, bool]:
        """Status, headers (lower-case names), body, and whether the server keeps the connection open."""
        sock = self.sock
        if sock is None:
            raise ConnectionError("no request was sent on this connection")
        while True:
            status, out_headers, keep = self._read_head(sock)
            if status >= 200:
                break  # 1xx: informational, the real response follows
        data = self._read_body(sock, out_headers)
        return status, out_headers, data, keep

    def _read_head(self, sock: socket.socket) -> tuple[int, dict[str, str], bool]:
        buf = self._buf
        start = 0
        while True:
            end = buf.find(b"\r\n\r\n", max(0, start - 3))
            if end >= 0:
                break
            if len(buf) > _MAX_HEAD:
                raise _ProtocolError(f"response head longer than {_MAX_HEAD} bytes")
            start = len(buf)
            self._recv(sock)
        head = bytes(buf[:end]).decode("latin-1")
        del buf[: end + 4]
        status_line, _, rest = head.partition("\r\n")
        version, _, tail = status_line.partition(" ")
        code = tail[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise _ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        out: dict[str, str] = {}
        for line in rest.split("\r\n") if rest else ():
            name, sep, value = line.partition(":")
            if not sep:
                raise _ProtocolError(f"malformed response header line {line[:80]!r}")
            key = name.strip().lower()
            value = value.strip()
            out[key] = f"{out[key]}, {value}" if key in out else value
        conn = out.get("connection", "").lower()
        keep = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
        return int(code), out, keep

    def _read_body(self, sock: socket.socket, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._read_chunked(sock)
        length = headers.get("content-length")
        if length is None:
            while self._recv(sock, eof_ok=True):
                pass
            data = bytes(self._buf)
            self._buf.clear()
            return data
        try:
            n = int(length)
        except ValueError as e:
            raise _ProtocolError(f"bad Content-Length {length!r}") from e
        return self._take(sock, n)

    def _take(self, sock: socket.socket, n: int) -> bytes:
        buf = self._buf
        if len(buf) >= n:
            data = bytes(buf[:n])
            del buf[:n]
            return data
        out = bytearray(n)
        view = memoryview(out)
        got = len(buf)
        view[:got] = buf
        buf.clear()
        while got < n:
            k = sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError(f"connection closed after {got} of {n} body bytes")
            got += k
        return bytes(out)

    def _read_chunked(self, sock: socket.socket) -> bytes:
        parts: list[bytes] = []
        while True:
            line = self._line(sock)
            try:
                n = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError as e:
                raise _ProtocolError(f"bad chunk size line {line[:40]!r}") from e
            if n == 0:
                while self._line(sock):  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(self._take(sock, n))
            if self._take(sock, 2) != b"\r\n":
                raise _ProtocolError("chunk not followed by CRLF")

    def _line(self, sock: socket.socket) -> bytes:
        buf = self._buf
        while (i := buf.find(b"\r\n")) < 0:
            if len(buf) > _MAX_HEAD:
                raise _ProtocolError("line too long in a chunked body")
            self._recv(sock)
        line = bytes(buf[:i])
        del buf[: i + 2]
        return line

    def _recv(self, sock: socket.socket, *, eof_ok: bool = False) -> int:
        data = sock.recv(256 * 1024)
        if not data and not eof_ok:
            raise ConnectionError("connection closed by the server before its response ended")
        self._buf += data
        return len(data)


def _send_all(sock: socket.socket, head: bytes, body: bytes) -> None:
    views = [memoryview(head), memoryview(body).cast("B")] if body else [memoryview(head)]
    while views:
        n = sock.sendmsg(views)
        advance_views(views, n)


class HttpPoster:
    """POSTs to one ``http://host:port`` base URL over keep-alive connections, thread-safe.

    :meth:`send` writes a request and returns what reads its response, so a caller can put several
    requests on the wire from one thread and wait for their responses in others: a master at 0.29 of a
    core sends a stage's invocations one after another, before it computes its own part, rather than
    waking a thread per invocation to send each. An idle connection is reused by whichever thread sends
    next (most recently used first). ``https://`` URLs go through ``http.client``, whose request and
    response are not split: there :meth:`send` sends nothing and what it returns does the whole POST.
    """

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http(s)://host[:port] URL")
        self.base_url = base_url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._idle: list[_PlainConnection | http.client.HTTPConnection] = []
        self._conns: set[_PlainConnection | http.client.HTTPConnection] = set()  # idle and in use, for close()
        self._lock = threading.Lock()

    def _checkout(self, *, fresh: bool = False) -> tuple[_PlainConnection | http.client.HTTPConnection, bool]:
        """A connection to send on, and whether it was used before (an idle one, unless ``fresh``)."""
        with self._lock:
            if self._idle and not fresh:
                return self._idle.pop(), True
        conn = http.client.HTTPSConnection(self._host, self._port) if self._https else _PlainConnection(
            self._host, self._port)
        with self._lock:
            self._conns.add(conn)
        return conn, False

    def _checkin(self, conn: _PlainConnection | http.client.HTTPConnection) -> None:
        with self._lock:
            if conn in self._conns:
                self._idle.append(conn)
                return
        conn.close()  # closed by close() while in use

    def _release(self, conn: _PlainConnection | http.client.HTTPConnection, keep: bool) -> None:
        """A response was read: the connection goes back to the idle ones, or closes (the server said so)."""
        if keep:
            self._checkin(conn)
        else:
            self._drop(conn)

    def _timed_out(self, what: str, timeout_s: float) -> InvokeTimeout:
        return InvokeTimeout(f"no reply from {what or self.base_url} within {timeout_s:.3g} s")

    def _unreachable(self, what: str, e: Exception) -> InvokeError:
        return InvokeError(f"cannot reach {self.base_url} ({what}): {e}")

    def _drop(self, conn: _PlainConnection | http.client.HTTPConnection) -> None:
        conn.close()
        with self._lock:
            self._conns.discard(conn)

    def post(
        self, path: str, body: bytes, *, timeout_s: float, headers: dict[str, str] | None = None, what: str = ""
    ) -> tuple[int, dict[str, str], bytes]:
        """Status, headers (lower-case names) and body. Raises InvokeTimeout / InvokeError."""
        return self.send(path, body, timeout_s=timeout_s, headers=headers, what=what)()

    def send(
        self, path: str, body: bytes, *, timeout_s: float, headers: dict[str, str] | None = None, what: str = ""
    ) -> Callable[[], tuple[int, dict[str, str], bytes]]:
        """Write the request now; the returned callable reads its status, headers and body (once, from any
        thread). Either raises InvokeTimeout / InvokeError."""
        hdrs = {"Content-Type": "application/octet-stream", **(headers or {})}
        if self._https:
            return functools.partial(self._post_https, path, body, hdrs, timeout_s, what)
        conn, reused = self._checkout()
        try:
            self._send(conn, path, body, hdrs, timeout_s, what)
        except InvokeError:
            if not reused:
                raise
            # A kept-alive connection the server closed while idle fails on first use: once more on a fresh one.
            conn, reused = self._checkout(fresh=True)
            self._send(conn, path, body, hdrs, timeout_s, what)
        return functools.partial(self._receive, conn, reused, path, body, hdrs, timeout_s, what)

    def _send(self, conn: _PlainConnection | http.client.HTTPConnection, path: str, body: bytes,
              headers: dict[str, str], timeout_s: float, what: str) -> None:
        assert isinstance(conn, _PlainConnection)
        try:
            conn.send_request(self._prefix + path, body, headers, timeout_s)
        except TimeoutError as e:
            self._drop(conn)
            raise self._timed_out(what, timeout_s) from e
        except OSError as e:
            self._drop(conn)
            raise self._unreachable(what, e) from e

    def _receive(self, conn: _PlainConnection | http.client.HTTPConnection, reused: bool, path: str, body: bytes,
                 headers: dict[str, str], timeout_s: float, what: str) -> tuple[int, dict[str, str], bytes]:
        assert isinstance(conn, _PlainConnection)
        try:
            status, out_headers, data, keep = conn.read_response()
        except TimeoutError as e:
            self._drop(conn)
            raise self._timed_out(what, timeout_s) from e
        except OSError as e:
            self._drop(conn)
            if reused:
                # the server closed the kept-alive connection as the request arrived: once more on a fresh
                # one (parts are idempotent, so even a request that did arrive may run again)
                fresh, _ = self._checkout(fresh=True)
                self._send(fresh, path, body, headers, timeout_s, what)
                return self._receive(fresh, False, path, body, headers, timeout_s, what)
            raise self._unreachable(what, e) from e
        self._release(conn, keep)
        return status, out_headers, data

    def _post_https(self, path: str, body: bytes, headers: dict[str, str], timeout_s: float,
                    what: str) -> tuple[int, dict[str, str], bytes]:
        for attempt in range(2):
            conn, reused = self._checkout(fresh=attempt > 0)
            assert isinstance(conn, http.client.HTTPConnection)
            try:
                status, out_headers, data, keep = _post_https(conn, self._prefix + path, body, headers, timeout_s)
            except TimeoutError as e:
                self._drop(conn)
                raise self._timed_out(what, timeout_s) from e
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                self._drop(conn)
                if reused and attempt == 0:
                    continue
                raise self._unreachable(what, e) from e
            self._release(conn, keep)
            return status, out_headers, data
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close every connection, idle or in use (a later request opens a new one)."""
        with self._lock:
            conns, self._conns, self._idle = self._conns, set(), []
        for conn in conns:
            conn.close()


def _post_https(conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str],
                timeout_s: float) -> tuple[int, dict[str, str], bytes, bool]:
    conn.timeout = timeout_s
    if conn.sock is not None:
        conn.sock.settimeout(timeout_s)
    conn.request("POST", path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    out_headers = {k.lower(): v for k, v in resp.getheaders()}
    return resp.status, out_headers, data, resp.getheader("connection", "").lower() != "close"
