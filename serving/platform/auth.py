"""Who may use the local platform: the holder of its token, and nobody else.

The platform makes a random token when it starts and writes it, readable by its owner only, into its own
state directory (:class:`PlatformHome`: ``$FLATPACK_STATE_DIR/platforms/<port>/``, mode 0700; the token
file 0600). Every route but ``GET /healthz`` requires it, in ``X-Flatpack-Token`` or
``Authorization: Bearer`` (boto3 signs ``Authorization`` itself, so a Lambda client sends the former;
see :func:`serving.platform.client.authorize_boto3`). Function instances get a second token, derived from
the first, that allows invocations only (``$FLATPACK_INVOKE_TOKEN``): the master invokes its workers with
it and can do nothing else. A request without a valid token is answered 401 in its route's shape before
anything else happens; the refusal is logged (method, path, peer), never the token presented.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from functions.invoker.local import TOKEN_HEADER, platform_home

__all__ = ["Access", "PlatformCredentials", "PlatformHome", "TokenMiddleware", "required_access"]

log = logging.getLogger(__name__)

_TOKEN_HEADER = TOKEN_HEADER.lower().encode()
_INVOKE_PREFIXES = ("/2015-03-31/functions/", "/function/")
_OPEN_PATHS = ("/healthz",)


class Access(Enum):
    """What a token allows."""

    INVOKE = "invoke"  # invoke routes only (a function instance's token)
    CONTROL = "control"  # everything (the platform's token)


@dataclass(frozen=True, repr=False)
class PlatformCredentials:
    """The platform's token and the invoke-only token derived from it (``repr`` shows neither)."""

    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    @property
    def invoke_token(self) -> str:
        return "i-" + hmac.new(self.token.encode(), b"flatpack-invoke", hashlib.sha256).hexdigest()

    def access(self, presented: str | None) -> Access | None:
        """What ``presented`` allows (None: nothing). Constant-time comparisons."""
        if not presented:
            return None
        got = presented.encode()
        if hmac.compare_digest(got, self.token.encode()):
            return Access.CONTROL
        if hmac.compare_digest(got, self.invoke_token.encode()):
            return Access.INVOKE
        return None

    def __repr__(self) -> str:
        return "PlatformCredentials(token=***)"


def required_access(method: str, path: str) -> Access | None:
    """What a request needs (None: nothing; only ``GET /healthz``)."""
    if path in _OPEN_PATHS and method in ("GET", "HEAD"):
        return None
    if method == "POST" and path.startswith(_INVOKE_PREFIXES):
        return Access.INVOKE
    return Access.CONTROL


def _presented(headers: list[tuple[bytes, bytes]]) -> str | None:
    bearer = None
    for k, v in headers:
        name = k.lower()
        if name == _TOKEN_HEADER:
            return v.decode("latin-1").strip()
        if name == b"authorization":
            scheme, _, rest = v.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                bearer = rest.strip()
    return bearer


_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_App = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


class TokenMiddleware:
    """ASGI middleware: a request without the access its route needs is answered 401 and goes no further
    (a plain ASGI wrapper rather than starlette's ``BaseHTTPMiddleware``, which would stream every
    invocation's body through a second task)."""

    def __init__(self, app: _App, credentials: PlatformCredentials, token_file: Path | None = None) -> None:
        self.app = app
        self.credentials = credentials
        self.token_file = token_file

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(send)

    def refusal(self, scope: _Scope) -> Callable[[_Send], Awaitable[None]] | None:
        """None where the request may go on; else what answers it (401), having logged why."""
        if scope["type"] != "http":
            return None
        method, path = scope["method"], scope["path"]
        need = required_access(method, path)
        if need is None:
            return None
        have = self.credentials.access(_presented(scope.get("headers") or []))
        if have is Access.CONTROL or (have is Access.INVOKE and need is Access.INVOKE):
            return None
        peer = scope.get("client") or ("?", 0)
        log.warning("refused %s %s from %s:%s: %s", method, path, peer[0], peer[1],
                    "no token" if have is None and not _presented(scope.get("headers") or []) else
                    "wrong token" if have is None else "an invoke-only token")
        message = self._message(have)
        return lambda send: _refuse(send, path, message)

    def _message(self, have: Access | None) -> str:
        if have is Access.INVOKE:
            return "this token allows invocations only"
        where = f" (its owner can read it from {self.token_file})" if self.token_file else ""
        return (f"missing or wrong platform token: send the token the local platform wrote at start{where} in "
                f"an '{TOKEN_HEADER}' or 'Authorization: Bearer' header")


async def _refuse(send: _Send, path: str, message: str) -> None:
    """401 in the shape of the route asked for (Lambda's, OpenFaaS's, or flatpack's own)."""
    headers = [(b"content-type", b"application/json"),
               (b"www-authenticate", b'Bearer realm="flatpack-platform"')]
    if path.startswith("/2015-03-31/"):
        body: dict[str, Any] = {"Type": "User", "message": message}
        headers.append((b"x-amzn-errortype", b"UnrecognizedClientException"))
    else:
        body = {"error": {"type": "Unauthorized", "message": message}}
    raw = json.dumps(body).encode()
    headers.append((b"content-length", str(len(raw)).encode()))
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


class PlatformHome:
    """The platform's own state directory, ``$FLATPACK_STATE_DIR/platforms/<port>`` (mode 0700): its
    token file (0600) and the bundles its functions run (see :class:`serving.platform.bundles.BundleStore`).

    Made afresh when the platform starts (whatever an earlier platform on this port left is removed: this
    one holds the port now) and removed when it stops.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def for_port(cls, port: int, state_dir: Path | None = None) -> PlatformHome:
        if state_dir is None:
            return cls(platform_home(port))
        return cls(state_dir / "platforms" / str(int(port)))

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def bundles(self) -> Path:
        return self.root / "bundles"

    def create(self, credentials: PlatformCredentials) -> PlatformHome:
        """Make the directory (0700, owned by this user) and write the token file (0600) atomically."""
        self.root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.root.is_symlink() or self.root.exists():
            self._remove()
        os.mkdir(self.root, 0o700)
        st = os.lstat(self.root)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{self.root} is not private to this user (mode {oct(st.st_mode & 0o777)}); "
                                  f"the platform keeps its token there")
        os.mkdir(self.bundles, 0o700)
        tmp = self.root / f".token.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, credentials.token.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.token_file)
        return self

    def remove(self, credentials: PlatformCredentials) -> None:
        """Remove the directory, unless another platform has taken the port (and the file) since."""
        try:
            current = self.token_file.read_text().strip()
        except OSError:
            current = None
        if current is not None and not hmac.compare_digest(current.encode(), credentials.token.encode()):
            return
        self._remove()

    def _remove(self) -> None:
        if self.root.is_symlink():
            self.root.unlink()
        else:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self.root)
