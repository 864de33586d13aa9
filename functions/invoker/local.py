"""Invoking functions on the local platform through its AWS-Lambda-shaped REST API, with its token.

The local platform answers only requests that carry its token (``X-Flatpack-Token`` or
``Authorization: Bearer``). Where a caller finds it:

* inside a function instance: ``$FLATPACK_INVOKE_TOKEN``, which the platform sets on every instance (a
  token that allows invocations only);
* anywhere else (a deployer, the CLI, a benchmark, a test): the file the platform writes when it starts,
  ``$FLATPACK_STATE_DIR/platforms/<port>/token``, readable by the platform's owner only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import quote, urlsplit

from functions import settings
from functions.invoker.base import Invoker, lambda_function_error, status_error
from functions.invoker.http import HttpPoster

__all__ = ["TOKEN_HEADER", "LocalInvoker", "platform_home", "platform_token", "read_platform_token"]

#: the header the local platform reads its token from (besides ``Authorization: Bearer``); boto3 signs
#: its own ``Authorization`` header, so a Lambda client pointed at the platform sends this one
TOKEN_HEADER = "X-Flatpack-Token"  # noqa: S105 - a header's name, not a secret


def platform_home(port: int, env: Mapping[str, str] | None = None) -> Path:
    """The state directory of the local platform listening on ``port`` (its token, its bundles):
    ``$FLATPACK_STATE_DIR/platforms/<port>``. Only the platform's owner can read it (mode 0700)."""
    return settings.state_dir(env) / "platforms" / str(int(port))


def _port(url: str) -> int:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s)://host[:port] URL")
    return parts.port or (443 if parts.scheme == "https" else 80)


def read_platform_token(url: str, env: Mapping[str, str] | None = None) -> str | None:
    """The control token of the local platform at ``url`` from the file it wrote at start (None: no
    such file, or this user may not read it)."""
    try:
        token = (platform_home(_port(url), env) / "token").read_text().strip()
    except (OSError, ValueError):
        return None
    return token or None


def platform_token(url: str, env: Mapping[str, str] | None = None) -> str | None:
    """The token an invoker sends to the local platform at ``url``: ``$FLATPACK_INVOKE_TOKEN`` inside a
    function instance, else the platform's token file (see :func:`read_platform_token`)."""
    return settings.invoke_token(env) or read_platform_token(url, env)


class LocalInvoker(Invoker):
    """``POST {base_url}/2015-03-31/functions/{name}/invocations``, binary messages, keep-alive.

    Speaks the same shape as AWS Lambda's Invoke API (errors as ``X-Amz-Function-Error`` + a JSON body),
    so the master code is the same here and in the cloud; only the message form differs (the local
    platform takes binary messages, Lambda needs JSON). ``token``: the platform's token (default: found
    as :func:`platform_token` says).
    """

    wire = "binary"

    def __init__(self, base_url: str, *, token: str | None = None) -> None:
        self._http = HttpPoster(base_url)
        self.base_url = self._http.base_url
        token = token or platform_token(self.base_url)
        self._headers = {"X-Amz-Invocation-Type": "RequestResponse"}
        if token:
            self._headers[TOKEN_HEADER] = token

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        return self.start(function, payload, timeout_s=timeout_s)()

    def start(self, function: str, payload: bytes, *, timeout_s: float) -> Callable[[], bytes]:
        reply = self._http.send(
            f"/2015-03-31/functions/{quote(function, safe='')}/invocations",
            payload,
            timeout_s=timeout_s,
            headers=self._headers,
            what=f"function {function}",
        )

        def result() -> bytes:
            status, headers, body = reply()
            if status == 200:
                if headers.get("x-amz-function-error"):
                    raise lambda_function_error(function, body)
                return body
            raise status_error(function, status, body, where=f"the local platform at {self.base_url}")

        return result

    def close(self) -> None:
        self._http.close()
