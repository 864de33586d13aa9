"""A small client for the local platform's management API (standard library only), with its token.

The token is the one the platform wrote when it started (``$FLATPACK_STATE_DIR/platforms/<port>/token``,
readable by its owner only), unless one is given. :func:`authorize_boto3` makes a boto3 Lambda client
pointed at the platform send it too.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from functions.invoker.local import TOKEN_HEADER, platform_home, read_platform_token
from serving.platform.spec import FunctionSpec

__all__ = ["PlatformClient", "PlatformUnavailable", "authorize_boto3"]


class PlatformUnavailable(ConnectionError):
    """No platform answers at the URL."""


class PlatformClient:
    """``url``: the platform's base URL. ``token``: its token (default: read from the token file the
    platform at ``url``'s port wrote; without one, every call but :meth:`health` is refused with 401)."""

    def __init__(self, url: str, *, timeout_s: float = 30.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._token = token

    @property
    def token(self) -> str | None:
        # read when first needed: a client may be made before its platform has started
        if self._token is None:
            self._token = read_platform_token(self.url)
        return self._token

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if path != "/healthz" and self.token:
            headers[TOKEN_HEADER] = self.token
        req = urllib.request.Request(self.url + path, data=data, method=method,  # noqa: S310 - http(s) URL we were given
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                msg = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = raw.decode("utf-8", "replace")
            if e.code == 401 and self._token is None:
                msg += f" (no readable token file for this platform under {self._home()})"
            raise ValueError(f"{method} {path}: HTTP {e.code}: {msg}") from e
        except (urllib.error.URLError, OSError) as e:
            raise PlatformUnavailable(f"no local platform answers at {self.url} ({e})") from e
        if not raw:
            return None
        if path == "/metrics":
            return raw.decode()
        return json.loads(raw)

    def _home(self) -> Path | str:
        from urllib.parse import urlsplit

        try:
            return platform_home(urlsplit(self.url).port or 80)
        except ValueError:
            return "$FLATPACK_STATE_DIR/platforms/<port>"

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    def stage_bundle(self, bundle_dir: str | Path) -> str:
        """Have the platform take in the bundle at ``bundle_dir`` (copied into its own state directory and
        checked against its manifest); the directory functions are then registered on."""
        return str(self._call("PUT", "/flatpack/bundles", {"source": str(Path(bundle_dir).resolve())})["bundle_dir"])

    def register(self, spec: FunctionSpec) -> dict[str, Any]:
        return self._call("PUT", f"/flatpack/functions/{spec.name}", spec.to_json())

    def remove(self, name: str) -> None:
        self._call("DELETE", f"/flatpack/functions/{name}")

    def functions(self) -> list[dict[str, Any]]:
        return self._call("GET", "/flatpack/functions")["functions"]

    def function(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/flatpack/functions/{name}")

    def meter(self) -> dict[str, Any]:
        return self._call("GET", "/flatpack/meter")

    def metrics_text(self) -> str:
        return self._call("GET", "/metrics")


def authorize_boto3(client: Any, token: str) -> Any:
    """Make a boto3 ``lambda`` client (``endpoint_url`` pointed at the local platform) send the platform's
    token: an ``X-Flatpack-Token`` header added after signing (SigV4 signs ``Authorization``, which the
    platform does not read). Returns ``client``."""

    def _add(request: Any, **_: Any) -> None:
        request.headers[TOKEN_HEADER] = token

    client.meta.events.register("before-send.lambda.*", _add)
    return client
