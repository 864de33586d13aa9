"""Invoking functions on the local platform through its AWS-Lambda-shaped REST API."""

from __future__ import annotations

from urllib.parse import quote

from functions.invoker.base import Invoker, lambda_function_error, status_error
from functions.invoker.http import HttpPoster

__all__ = ["LocalInvoker"]


class LocalInvoker(Invoker):
    """``POST {base_url}/2015-03-31/functions/{name}/invocations``, binary messages, keep-alive.

    Speaks the same shape as AWS Lambda's Invoke API (errors as ``X-Amz-Function-Error`` + a JSON body),
    so the master code is the same here and in the cloud; only the message form differs (the local
    platform takes binary messages, Lambda needs JSON).
    """

    wire = "binary"

    def __init__(self, base_url: str) -> None:
        self._http = HttpPoster(base_url)
        self.base_url = self._http.base_url

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        status, headers, body = self._http.post(
            f"/2015-03-31/functions/{quote(function, safe='')}/invocations",
            payload,
            timeout_s=timeout_s,
            headers={"X-Amz-Invocation-Type": "RequestResponse"},
            what=f"function {function}",
        )
        if status == 200:
            if headers.get("x-amz-function-error"):
                raise lambda_function_error(function, body)
            return body
        raise status_error(function, status, body, where=f"the local platform at {self.base_url}")

    def close(self) -> None:
        self._http.close()
