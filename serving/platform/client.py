"""A small client for the local platform's management API (standard library only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from serving.platform.spec import FunctionSpec

__all__ = ["PlatformClient", "PlatformUnavailable"]


class PlatformUnavailable(ConnectionError):
    """No platform answers at the URL."""


class PlatformClient:
    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,  # noqa: S310 - http(s) URL we were given
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                msg = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = raw.decode("utf-8", "replace")
            raise ValueError(f"{method} {path}: HTTP {e.code}: {msg}") from e
        except (urllib.error.URLError, OSError) as e:
            raise PlatformUnavailable(f"no local platform answers at {self.url} ({e})") from e
        if not raw:
            return None
        if path == "/metrics":
            return raw.decode()
        return json.loads(raw)

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

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
