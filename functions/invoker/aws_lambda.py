"""Invoking AWS Lambda functions with boto3 (``RequestResponse``), or anything speaking its REST shape.

A function named ``name:qualifier`` (what :meth:`functions.config.FunctionConfig.invoke_name` gives with
``FLATPACK_INVOKE_QUALIFIER``) is invoked at that alias or version through the ``Qualifier`` parameter, so
a redeploy that moves the alias never mixes versions inside one request.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

from functions.errors import (
    BadRequest,
    FunctionNotFound,
    InvokeError,
    InvokeTimeout,
    PayloadTooLarge,
    Throttled,
)
from functions.invoker.base import Invoker, lambda_function_error

__all__ = ["LambdaInvoker"]

_OFFLINE_TIMEOUT = b"[504] - Lambda timeout."


def _split_qualifier(function: str) -> tuple[str, str | None]:
    """``name:qualifier`` -> (name, qualifier); a bare name or an ARN is left whole."""
    if function.startswith("arn:"):
        return function, None
    name, sep, qualifier = function.partition(":")
    return (name, qualifier) if sep and qualifier else (function, None)


class LambdaInvoker(Invoker):
    """boto3 ``lambda.invoke``. Messages are JSON (a Lambda handler receives its event parsed from JSON).

    botocore has no per-call timeout, so one client is kept per whole-second read timeout.
    botocore's own retries are off: the caller's policy decides what to retry.

    Parameters
    ----------
    region: AWS region of the functions.
    endpoint_url: Lambda endpoint override (the local platform's URL in tests).
    max_connections: connection pool per client (concurrent invocations).
    headers: sent with every invocation, added after boto3 signs it (the local platform's token).
    """

    wire = "json"

    def __init__(
        self, *, region: str = "us-east-1", endpoint_url: str | None = None, max_connections: int = 64,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError as e:
            raise InvokeError("the Lambda invoker needs boto3: pip install 'flatpack[aws]'") from e
        self._boto3 = boto3
        self._config = botocore.config.Config
        self._exc = botocore.exceptions
        self._region = region
        self._endpoint = endpoint_url
        self._max_connections = max_connections
        self._headers = dict(headers or {})
        self._session = boto3.session.Session()
        self._clients: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _client(self, timeout_s: float) -> Any:
        key = max(1, math.ceil(timeout_s))
        with self._lock:
            c = self._clients.get(key)
            if c is None:
                c = self._session.client(
                    "lambda",
                    region_name=self._region,
                    endpoint_url=self._endpoint,
                    config=self._config(
                        read_timeout=key,
                        connect_timeout=min(5, key),
                        retries={"total_max_attempts": 1},
                        max_pool_connections=self._max_connections,
                    ),
                )
                if self._headers:
                    c.meta.events.register("before-send.lambda.*", self._add_headers)
                self._clients[key] = c
            return c

    def _add_headers(self, request: Any, **_: Any) -> None:
        request.headers.update(self._headers)

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        exc = self._exc
        name, qualifier = _split_qualifier(function)
        kwargs = {"Qualifier": qualifier} if qualifier else {}
        try:
            resp = self._client(timeout_s).invoke(
                FunctionName=name, InvocationType="RequestResponse", Payload=payload, **kwargs
            )
            body: bytes = resp["Payload"].read()
        except exc.ReadTimeoutError as e:
            # worded as the HTTP invokers word it, the caller naming where it waited: a timeout reads the
            # same on every target
            raise InvokeTimeout(f"no reply from function {name} within {timeout_s:.3g} s") from e
        except (exc.EndpointConnectionError, exc.ConnectionClosedError, exc.ConnectTimeoutError) as e:
            raise InvokeError(f"cannot reach Lambda ({self._endpoint or self._region}): {e}", function=function) from e
        except exc.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            msg = e.response.get("Error", {}).get("Message", str(e))
            if code == "ResourceNotFoundException":
                raise FunctionNotFound(f"no Lambda function {function!r}: {msg}", function=function) from e
            if code in ("TooManyRequestsException", "ThrottlingException"):
                raise Throttled(msg, function=function) from e
            if code in ("RequestTooLargeException", "413"):
                raise PayloadTooLarge(msg, function=function) from e
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status >= 500:
                raise InvokeError(f"{code}: {msg}", function=function) from e
            raise BadRequest(f"{code}: {msg}", function=function) from e
        except exc.BotoCoreError as e:
            raise InvokeError(f"Lambda invoke failed: {e}", function=function) from e
        if resp.get("FunctionError"):
            if _OFFLINE_TIMEOUT in body:
                # serverless-offline's words for Lambda's "Task timed out after N seconds"
                raise InvokeTimeout(f"{name}: the function's timeout passed ({_OFFLINE_TIMEOUT.decode()})",
                                    function=function)
            raise lambda_function_error(function, body)
        return body

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
