"""A minimal Open Inference Protocol v2 client (binary tensor extension), for the CLI and warm-ups."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np

from functions.inference_protocol import DATATYPES, HEADER_LENGTH, datatype_of
from functions.settings import api_token

__all__ = ["InferError", "infer_http"]


class InferError(RuntimeError):
    """The endpoint refused or failed a request; the message is the server's."""


def infer_http(endpoint: str, model: str, inputs: dict[str, np.ndarray], *, timeout_s: float = 120.0,
               token: str | None = None) -> dict[str, np.ndarray]:
    """One OIP v2 infer request with binary tensors; raises InferError with the server's message."""
    header = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": datatype_of(v.dtype),
                          "parameters": {"binary_data_size": v.nbytes}} for k, v in inputs.items()],
              "parameters": {"binary_data_output": True}}
    head = json.dumps(header).encode()
    body = head + b"".join(np.ascontiguousarray(v).tobytes() for v in inputs.values())
    headers = {HEADER_LENGTH: str(len(head)), "Content-Type": "application/octet-stream"}
    token = token or api_token()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if not endpoint.startswith(("http://", "https://")):
        raise InferError(f"endpoint {endpoint!r} is not an http(s) URL")
    req = urllib.request.Request(f"{endpoint}/v2/models/{model}/infer", data=body, headers=headers,  # noqa: S310
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - our own loopback endpoint
            data = resp.read()
            n = int(resp.headers.get(HEADER_LENGTH, len(data)))
    except urllib.error.HTTPError as e:
        raise InferError(f"HTTP {e.code}: {e.read().decode(errors='replace')}") from e
    except urllib.error.URLError as e:
        raise InferError(f"cannot reach {endpoint}: {e.reason}") from e
    doc = json.loads(data[:n])
    out, offset = {}, n
    for o in doc["outputs"]:
        dtype = DATATYPES[o["datatype"]]
        if "data" in o:
            out[o["name"]] = np.asarray(o["data"], dtype=dtype).reshape(o["shape"])
        else:
            size = int(o["parameters"]["binary_data_size"])
            out[o["name"]] = np.frombuffer(data[offset:offset + size], dtype=dtype).reshape(o["shape"])
            offset += size
    return out
