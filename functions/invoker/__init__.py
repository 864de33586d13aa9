"""Invokers: one interface over the local platform (HTTP), AWS Lambda (boto3) and OpenFaaS (gateway),
plus the deadline / retry / hedging policy around them."""

from __future__ import annotations

from functions.config import FunctionConfig
from functions.invoker.base import Invoker
from functions.invoker.policy import CallKey, DurationStats, InvokePolicy, PolicyInvoker

__all__ = [
    "CallKey",
    "DurationStats",
    "InvokePolicy",
    "Invoker",
    "PolicyInvoker",
    "make_invoker",
]


def make_invoker(config: FunctionConfig) -> Invoker:
    """The invoker ``config.invoker`` names, pointed at ``config.invoke_url``."""
    if config.invoker == "local":
        from functions.invoker.local import LocalInvoker

        if not config.invoke_url:
            raise ValueError("FLATPACK_INVOKE_URL must name the local platform (e.g. http://127.0.0.1:8808)")
        return LocalInvoker(config.invoke_url)
    if config.invoker == "openfaas":
        from functions.invoker.openfaas import OpenFaaSInvoker

        if not config.invoke_url:
            raise ValueError("FLATPACK_INVOKE_URL must name the OpenFaaS gateway (e.g. http://gateway:8080)")
        return OpenFaaSInvoker(config.invoke_url)
    from functions.invoker.aws_lambda import LambdaInvoker

    return LambdaInvoker(region=config.aws_region, endpoint_url=config.invoke_url)
