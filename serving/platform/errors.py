"""The local platform's errors and how each one is answered over HTTP.

Two shapes: AWS Lambda's Invoke API (platform errors as HTTP status + ``x-amzn-ErrorType``; function
errors as HTTP 200 + ``X-Amz-Function-Error: Unhandled`` + ``{errorType, errorMessage}``, which is what
boto3 and the invokers read) and the OpenFaaS gateway's (a status code and a JSON error body).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "FunctionCrashed",
    "FunctionFailed",
    "FunctionInitFailed",
    "FunctionOutOfMemory",
    "FunctionTimedOut",
    "NoSuchFunction",
    "PlatformError",
    "RequestTooLarge",
    "ResponseTooLarge",
    "TooManyRequests",
]


class PlatformError(RuntimeError):
    """Something the platform refuses (``status`` + AWS ``error_type``) before the function runs."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "ServiceException"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoSuchFunction(PlatformError, LookupError):
    status = 404
    error_type = "ResourceNotFoundException"


class TooManyRequests(PlatformError):
    status = 429
    error_type = "TooManyRequestsException"


class RequestTooLarge(PlatformError, ValueError):
    status = 413
    error_type = "RequestTooLargeException"


class FunctionFailed(RuntimeError):
    """The invocation ran but the instance failed (Lambda: an "Unhandled" function error)."""

    lambda_type: ClassVar[str] = "Runtime.ExitError"
    flatpack_type: ClassVar[str] = "Crashed"
    status: ClassVar[int] = 502

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class FunctionCrashed(FunctionFailed):
    pass


class FunctionOutOfMemory(FunctionFailed, MemoryError):
    lambda_type = "Runtime.OutOfMemory"
    flatpack_type = "OutOfMemory"
    status = 500


class FunctionTimedOut(FunctionFailed, TimeoutError):
    lambda_type = "Sandbox.Timedout"
    flatpack_type = "Timeout"
    status = 504


class FunctionInitFailed(FunctionFailed):
    lambda_type = "Runtime.InitError"
    flatpack_type = "InitError"
    status = 500


class ResponseTooLarge(FunctionFailed):
    lambda_type = "Function.ResponseSizeTooLarge"
    flatpack_type = "PayloadTooLarge"
    status = 500
