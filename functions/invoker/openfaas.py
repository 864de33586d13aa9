"""Invoking OpenFaaS functions through the gateway (``POST /function/NAME``)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from urllib.parse import quote

from functions.event import Reply
from functions.invoker.base import Invoker, status_error
from functions.invoker.http import HttpPoster

__all__ = ["OpenFaaSInvoker"]


class OpenFaaSInvoker(Invoker):
    """Synchronous invocations through an OpenFaaS gateway (or the local platform's OpenFaaS route).

    A flatpack function answers an error with HTTP 500 and a reply that carries the structured error;
    such a body is returned for the caller to judge. Other failures map from the HTTP status.
    ``basic_auth`` is ``user:password`` for a gateway with basic auth; ``headers`` are sent with every
    invocation (the local platform's token, when pointed at its OpenFaaS route).
    """

    wire = "binary"

    def __init__(self, gateway_url: str, *, basic_auth: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self._http = HttpPoster(gateway_url)
        self.base_url = self._http.base_url
        self._headers = dict(headers or {})
        if basic_auth:
            self._headers["Authorization"] = "Basic " + base64.b64encode(basic_auth.encode()).decode()

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        return self.start(function, payload, timeout_s=timeout_s)()

    def start(self, function: str, payload: bytes, *, timeout_s: float) -> Callable[[], bytes]:
        reply = self._http.send(
            f"/function/{quote(function, safe='')}",
            payload,
            timeout_s=timeout_s,
            headers=self._headers,
            what=f"function {function}",
        )

        def result() -> bytes:
            status, _, body = reply()
            if status == 200:
                return body
            try:
                if Reply.decode(body).error is not None:
                    return body
            except ValueError:
                pass
            raise status_error(function, status, body, where=f"the OpenFaaS gateway at {self.base_url}")

        return result

    def close(self) -> None:
        self._http.close()
