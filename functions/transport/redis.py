"""Redis transport: one key per tensor, ``flatpack:<deployment>:<request>:<tensor>``, with a TTL.

Values are codec bytes. A read with ``delete=True`` is one GETDEL (Redis >= 6.2; older servers get
GET + DEL in a transaction). A discarded request (:meth:`Transport.discard`) is marked by the key
``flatpack-discarded:<deployment>:<request>`` (with the same TTL); every SET is pipelined with an EXISTS
of its request's mark. Connection and socket timeouts are short, so an unreachable server is a
:class:`TransportError` naming the URL within about a second, never a hang.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from functions.codec import Compression, decode, encode_parts
from functions.errors import TransportError
from functions.transport.base import TensorKey, Transport
from functions.transport.resp import RespConnection, RespError, resp_address

__all__ = ["RedisTransport", "redact_url"]

log = logging.getLogger(__name__)


def redact_url(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def _redact(text: str, url: str) -> str:
    password = urlsplit(url).password
    return text.replace(password, "***") if password else text


class RedisTransport(Transport):
    """Tensors in Redis.

    Parameters
    ----------
    url: ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``).
    ttl_s: expiry of every key, the backstop behind delete-after-read.
    connect_timeout_s: how long to wait for a TCP connection before calling the server unreachable.
    socket_timeout_s: how long one command may take (a 64 MB GET on loopback takes well under a second).
    prefix: first part of every key.
    """

    scheme = "redis"

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        ttl_s: int = 600,
        connect_timeout_s: float = 1.0,
        socket_timeout_s: float = 10.0,
        prefix: str = "flatpack",
    ) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as e:
            raise TransportError("the redis transport needs redis-py: pip install 'flatpack[redis]'") from e
        self.url = url
        self._safe_url = redact_url(url)
        self._ttl = int(ttl_s)
        self._prefix = prefix
        self._errors: tuple[type[BaseException], ...] = (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
        )
        self._response_error = redis.exceptions.ResponseError
        # what a SET or GET may raise, on either connection
        self._command_errors: tuple[type[BaseException], ...] = (
            *self._errors, self._response_error, ConnectionError, RespError
        )
        self._client = redis.Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=socket_timeout_s,
            # redis-py reads replies in chunks of this size; its 64 KB default makes a 4 MB GET 3x slower.
            socket_read_size=1 << 20,
            # one quick retry covers a pooled connection the server dropped; more would only delay the
            # clear error an unreachable server deserves (the invoker retries the whole part anyway).
            retry=Retry(NoBackoff(), 1),
        )
        self._getdel = True
        self._lock = threading.Lock()
        # SET and GET(DEL) of tensors go over plain RESP connections (one per thread), without redis-py's
        # reply copies; TLS and unix-socket URLs stay on redis-py.
        self._fast = resp_address(url)
        self._timeouts = (connect_timeout_s, socket_timeout_s)
        self._local = threading.local()

    def _name(self, key: TensorKey) -> str:
        return f"{self._prefix}:{key.deployment}:{key.request_id}:{key.name}"

    def _fail(self, what: str, e: BaseException) -> TransportError:
        detail = _redact(str(e), self.url)
        if isinstance(e, RespError | self._response_error):
            return TransportError(f"cannot {what}: Redis at {self._safe_url} answered: {detail}")
        return TransportError(
            f"cannot {what}: Redis at {self._safe_url} is unreachable ({detail}); start redis-server there "
            f"or point FLATPACK_REDIS_URL at a running one"
        )

    def ping(self) -> None:
        """Raise :class:`TransportError` unless the server answers."""
        try:
            self._client.ping()
        except self._errors as e:
            raise self._fail("ping", e) from e

    def _resp(self, *args: bytes, value: tuple = (), tail: tuple = (), then: tuple = ()) -> object:
        """One command on this thread's RESP connection (with ``then`` pipelined after it: its reply is
        returned instead); a dropped connection is retried once."""
        assert self._fast is not None
        for attempt in range(2):
            conn = getattr(self._local, "conn", None)
            reused = conn is not None
            try:
                if conn is None:
                    conn = RespConnection(**self._fast, connect_timeout_s=self._timeouts[0],
                                          timeout_s=self._timeouts[1])
                    self._local.conn = conn
                if then:
                    return conn.call_then(*args, value=value or None, tail=tail, then=then)
                return conn.call(*args, value=value or None, tail=tail)
            except RespError:
                raise
            except (OSError, ValueError) as e:
                if conn is not None:
                    conn.close()
                self._local.conn = None
                if reused and attempt == 0:
                    continue
                raise ConnectionError(str(e)) from e
        raise AssertionError("unreachable")

    def put(self, key: TensorKey, array: np.ndarray, *, compression: Compression = "none") -> str:
        head, payload = encode_parts(array, compression)
        name = self._name(key)
        mark = self._mark(key.deployment, key.request_id)
        try:
            # the SET and the check for a discard mark in one round trip; the server runs them in order
            if self._fast is not None:
                discarded = self._resp(b"SET", name.encode(), value=(head, payload),
                                       tail=(b"EX", b"%d" % self._ttl), then=(b"EXISTS", mark.encode()))
            else:
                pipe = self._client.pipeline(transaction=False)
                pipe.set(name, b"".join((head, payload)), ex=self._ttl)
                pipe.exists(mark)
                discarded = pipe.execute()[1]
            if discarded:
                self._client.unlink(name)  # see Transport.discard
                log.debug("dropped %s: request %s was discarded", name, key.request_id)
        except self._command_errors as e:
            raise self._fail(f"store tensor {key}", e) from e
        return self.ref(key)

    def _mark(self, deployment: str, request_id: str) -> str:
        # outside the tensors' key space, so counts and purges of tensors never see it
        return f"{self._prefix}-discarded:{deployment}:{request_id}"

    def _mark_discarded(self, deployment: str, request_id: str) -> None:
        try:
            self._client.set(self._mark(deployment, request_id), b"1", ex=self._ttl)
        except self._errors as e:
            raise self._fail(f"mark request {request_id} discarded", e) from e

    def get(self, ref: str, *, delete: bool = False) -> np.ndarray:
        name = self._name(self.key_of(ref))
        try:
            if self._fast is not None and (self._getdel or not delete):
                try:
                    data = self._resp(b"GETDEL" if delete else b"GET", name.encode())
                except RespError as e:
                    if "unknown command" not in str(e).lower():
                        raise
                    log.info("Redis at %s has no GETDEL (< 6.2); using GET + DEL", self._safe_url)
                    self._getdel = False
                    data = self._getdel_or_get(name)
            else:
                data = self._getdel_or_get(name) if delete else self._client.get(name)
        except self._command_errors as e:
            raise self._fail(f"fetch tensor {ref}", e) from e
        if data is None:
            raise TransportError(f"tensor {ref} is not in Redis ({self._safe_url}, key {name}): expired or deleted")
        if not isinstance(data, bytes | bytearray | memoryview):
            # a bulk string is bytes (redis-py) or a memoryview (RESP); redis-py's types also allow str, which
            # only a client made with decode_responses (never this one) returns
            raise TransportError(f"Redis key {name} answered a {type(data).__name__}, not a flatpack tensor")
        try:
            return decode(data)
        except ValueError as e:
            raise TransportError(f"Redis key {name} does not hold a flatpack tensor: {e}") from e

    def _getdel_or_get(self, name: str) -> bytes | str | None:
        if self._getdel:
            try:
                return self._client.getdel(name)
            except self._response_error as e:
                if "unknown command" not in str(e).lower():
                    raise
                log.info("Redis at %s has no GETDEL (< 6.2); using GET + DEL", self._safe_url)
                self._getdel = False
        pipe = self._client.pipeline(transaction=True)
        pipe.get(name)
        pipe.delete(name)
        return pipe.execute()[0]

    def delete(self, refs: Iterable[str]) -> None:
        names = [self._name(self.key_of(r)) for r in refs]
        if not names:
            return
        try:
            self._client.unlink(*names)
        except self._errors as e:
            raise self._fail("delete tensors", e) from e

    def _scan(self, pattern: str) -> list[bytes]:
        try:
            return list(self._client.scan_iter(match=pattern, count=1000))
        except self._errors as e:
            raise self._fail("list tensors", e) from e

    def purge(self, deployment: str, request_id: str | None = None) -> int:
        pattern = f"{self._prefix}:{deployment}:{request_id or '*'}:*"
        names = self._scan(pattern)
        if names:
            try:
                self._client.unlink(*names)
            except self._errors as e:
                raise self._fail("delete tensors", e) from e
        return len(names)

    def count(self, deployment: str) -> int:
        return len(self._scan(f"{self._prefix}:{deployment}:*"))

    def ttl_of(self, ref: str) -> int:
        """Seconds left on ``ref``'s key (-2: no such key, -1: no TTL)."""
        return int(self._client.ttl(self._name(self.key_of(ref))))

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        self._client.close()
