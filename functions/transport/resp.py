"""A minimal RESP2 connection that moves large values to and from Redis without extra copies.

redis-py's pure-Python reply parser copies a bulk reply four or five times (socket chunks into a
BytesIO, out again, joined, sliced), so a 16 MB GET runs at ~170 MB/s here. This connection sends a
value with one ``sendmsg`` of (command, tensor header, tensor bytes) and receives one with
``recv_into`` straight into the buffer the array will view. It speaks only what the Redis transport
needs for tensors (SET, GET, GETDEL, EXISTS, plus AUTH and SELECT to set up); everything else stays on redis-py.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from functions.codec import advance_views

__all__ = ["RespConnection", "RespError", "resp_address"]

_CRLF = b"\r\n"


class RespError(Exception):
    """An error reply from the server (``-ERR ...``)."""


def resp_address(url: str) -> dict[str, Any] | None:
    """Connection parameters of a plain ``redis://`` URL; None for TLS or unix sockets (not handled here)."""
    parts = urlsplit(url)
    if parts.scheme != "redis" or not parts.hostname:
        return None
    db = parts.path.strip("/") or "0"
    return {
        "host": parts.hostname,
        "port": parts.port or 6379,
        "username": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
        "db": int(db) if db.isdigit() else 0,
    }


def _command(args: Sequence[bytes], value: Sequence[Any] | None, tail: Sequence[bytes]) -> list[Any]:
    """The RESP array of one command: ``args``, then ``value`` (one argument of several buffers), then ``tail``."""
    n_args = len(args) + (value is not None) + len(tail)
    chunks: list[Any] = [b"*%d\r\n" % n_args]
    for a in args:
        chunks.append(b"$%d\r\n%s\r\n" % (len(a), a))
    if value is not None:
        size = sum(memoryview(v).nbytes for v in value)
        chunks.append(b"$%d\r\n" % size)
        chunks.extend(value)
        chunks.append(_CRLF)
    for a in tail:
        chunks.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return chunks


class RespConnection:
    """One TCP connection to Redis; not thread-safe (keep one per thread)."""

    def __init__(self, host: str, port: int, *, username: str | None = None, password: str | None = None,
                 db: int = 0, connect_timeout_s: float = 1.0, timeout_s: float = 10.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        self._sock.settimeout(timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        if password:
            self.call(b"AUTH", *([username.encode()] if username else []), password.encode())
        if db:
            self.call(b"SELECT", str(db).encode())

    def close(self) -> None:
        self._sock.close()

    # -- sending -------------------------------------------------------------------------------------------

    def _send(self, chunks: Sequence[Any]) -> None:
        views = [memoryview(c).cast("B") for c in chunks]
        views = [v for v in views if v.nbytes]
        while views:
            n = self._sock.sendmsg(views[:512])
            advance_views(views, n)

    def call(self, *args: bytes, value: Sequence[Any] | None = None, tail: Sequence[bytes] = ()) -> Any:
        """Send ``args`` (then ``value``, one argument made of several buffers, then ``tail``); return the
        reply: bytes-like for a bulk string, int, str for a status, None for a nil, list for an array."""
        self._send(_command(args, value, tail))
        return self._reply()

    def call_then(self, *args: bytes, value: Sequence[Any] | None = None, tail: Sequence[bytes] = (),
                  then: Sequence[bytes]) -> Any:
        """:meth:`call`, with the command ``then`` pipelined after it (one round trip; the server runs it
        after the first); returns ``then``'s reply. An error reply to the first is raised once both
        replies are read, so the connection stays in step."""
        self._send([*_command(args, value, tail), *_command(then, None, ())])
        try:
            self._reply()
        except RespError:
            self._reply()
            raise
        return self._reply()

    # -- receiving -----------------------------------------------------------------------------------------

    def _fill(self) -> None:
        data = self._sock.recv(1 << 16)
        if not data:
            raise ConnectionError("Redis closed the connection")
        self._buf += data

    def _line(self) -> bytes:
        while True:
            i = self._buf.find(_CRLF)
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[: i + 2]
                return line
            self._fill()

    def _reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._bulk(n)
        if kind == b"+":
            return rest.decode()
        if kind == b":":
            return int(rest)
        if kind == b"-":
            raise RespError(rest.decode("utf-8", "replace"))
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise ConnectionError(f"unexpected reply from Redis: {line[:40]!r}")

    def _bulk(self, n: int) -> memoryview:
        """``n`` bytes (and the CRLF after them), received straight into their own buffer."""
        out = bytearray(n + 2)
        view = memoryview(out)
        got = min(len(self._buf), n + 2)
        view[:got] = self._buf[:got]
        del self._buf[:got]
        while got < n + 2:
            k = self._sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("Redis closed the connection mid-reply")
            got += k
        return view[:n]
