"""Keep-alive HTTP POSTs from many threads (one connection per thread and host), standard library only."""

from __future__ import annotations

import http.client
import threading
from urllib.parse import urlsplit

from functions.errors import InvokeError, InvokeTimeout

__all__ = ["HttpPoster"]


class HttpPoster:
    """POSTs to one ``http://host:port`` base URL, reusing a connection per thread."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http(s)://host[:port] URL")
        self.base_url = base_url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._local = threading.local()

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port)
        self._local.conn = conn
        return conn, False

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def post(
        self, path: str, body: bytes, *, timeout_s: float, headers: dict[str, str] | None = None, what: str = ""
    ) -> tuple[int, dict[str, str], bytes]:
        """Status, headers (lower-case names) and body. Raises InvokeTimeout / InvokeError."""
        hdrs = {"Content-Type": "application/octet-stream", **(headers or {})}
        for attempt in range(2):
            conn, reused = self._connection()
            conn.timeout = timeout_s
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout_s)
                conn.request("POST", self._prefix + path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
                out_headers = {k.lower(): v for k, v in resp.getheaders()}
                if resp.getheader("connection", "").lower() == "close":
                    self._drop()
                return resp.status, out_headers, data
            except TimeoutError as e:
                self._drop()
                raise InvokeTimeout(f"no reply from {what or self.base_url} within {timeout_s:.3g} s") from e
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                self._drop()
                # A kept-alive connection the server closed while idle fails on first use: retry once on a
                # fresh one (parts are idempotent, so even a request that did arrive may run again).
                if reused and attempt == 0:
                    continue
                raise InvokeError(f"cannot reach {self.base_url} ({what}): {e}") from e
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._drop()
