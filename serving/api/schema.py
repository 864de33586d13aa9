"""The infer request's JSON schema, for the endpoint's OpenAPI document only.

Requests are decoded by :mod:`functions.inference_protocol` (the codec every target shares, no pydantic);
these pydantic models describe the same JSON form so ``/openapi.json`` publishes it (KServe's
``v2_datamodels`` is the model).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["InferInput", "InferRequest", "RequestedOutput"]


class InferInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: Any = None


class RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    parameters: dict[str, Any] | None = None


class InferRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[InferInput] = Field(min_length=1)
    outputs: list[RequestedOutput] | None = None
