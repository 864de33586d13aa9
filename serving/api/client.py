"""A minimal Open Inference Protocol v2 client (JSON, or the binary tensor extension), for the CLI, warm-ups
and benchmarks.

:class:`InferClient` keeps its connection open between requests (HTTP/1.1 keep-alive, as tritonclient
and every production client do): a new TCP connection per request costs more than the endpoint itself
spends on a small model. One client per thread; it reconnects once when the server closed the connection.
:func:`infer_http` is one request on a fresh client.
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from functions import json_codec
from functions.inference_protocol import DATATYPES, HEADER_LENGTH, datatype_of
from functions.settings import api_token

__all__ = ["InferClient", "InferError", "infer_http"]


class InferError(RuntimeError):
    """The endpoint refused or failed a request; the message is the server's."""


class InferClient:
    """Infer requests to model ``model`` at ``endpoint`` over one kept-alive connection.

    Parameters
    ----------
    endpoint: the endpoint's base URL (``http://host:port``).
    model: the model's name.
    binary: tensors as the binary tensor extension (raw bytes after a JSON header) both ways; False: as
        JSON ``data`` both ways.
    timeout_s: the socket timeout of each request.
    token: the bearer token (default: $FLATPACK_API_TOKEN).
    """

    def __init__(self, endpoint: str, model: str, *, binary: bool = True, timeout_s: float = 120.0,
                 token: str | None = None) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InferError(f"endpoint {endpoint!r} is not an http(s) URL")
        self.endpoint = endpoint
        self.path = f"{parts.path.rstrip('/')}/v2/models/{model}/infer"
        self.binary = binary
        conn_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._conn = conn_type(parts.hostname, parts.port, timeout=timeout_s)
        token = token or api_token()
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs for ``inputs``; raises InferError with the server's message."""
        body, headers = self._request(inputs)
        for attempt in (0, 1):
            try:
                self._conn.request("POST", self.path, body, headers)
                resp = self._conn.getresponse()
                data = resp.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self._conn.close()  # the server closed a kept-alive connection: once more on a new one
                if attempt:
                    raise InferError(f"cannot reach {self.endpoint}: {e}") from e
            except (OSError, http.client.HTTPException) as e:
                self._conn.close()
                raise InferError(f"cannot reach {self.endpoint}: {e}") from e
        if resp.status != 200:
            raise InferError(f"HTTP {resp.status}: {data.decode(errors='replace')}")
        return _outputs(data, resp.getheader(HEADER_LENGTH))

    def _request(self, inputs: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
        headers = dict(self._auth)
        arrays = {k: np.asarray(v, order="C") for k, v in inputs.items()}
        if not self.binary:
            doc = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": datatype_of(v.dtype),
                               "data": v.reshape(-1)} for k, v in arrays.items()]}
            headers["Content-Type"] = "application/json"
            return json_codec.dumps(doc), headers
        header = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": datatype_of(v.dtype),
                              "parameters": {"binary_data_size": v.nbytes}} for k, v in arrays.items()],
                  "parameters": {"binary_data_output": True}}
        head = json_codec.dumps(header)
        headers.update({HEADER_LENGTH: str(len(head)), "Content-Type": "application/octet-stream"})
        return b"".join([head, *(v.data for v in arrays.values())]), headers

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> InferClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _outputs(data: bytes, header_length: str | None) -> dict[str, np.ndarray]:
    n = int(header_length) if header_length is not None else len(data)
    doc: dict[str, Any] = json_codec.loads_tensors(memoryview(data)[:n], "outputs")
    out, offset = {}, n
    for o in doc["outputs"]:
        dtype = DATATYPES[o["datatype"]]
        if "data" in o:
            out[o["name"]] = np.asarray(o["data"], dtype=dtype).reshape(o["shape"])
        else:
            size = int(o["parameters"]["binary_data_size"])
            out[o["name"]] = np.frombuffer(data, dtype=dtype, count=size // dtype.itemsize,
                                           offset=offset).reshape(o["shape"])
            offset += size
    return out


def infer_http(endpoint: str, model: str, inputs: dict[str, np.ndarray], *, timeout_s: float = 120.0,
               token: str | None = None) -> dict[str, np.ndarray]:
    """One OIP v2 infer request with binary tensors; raises InferError with the server's message."""
    with InferClient(endpoint, model, timeout_s=timeout_s, token=token) as client:
        return client.infer(inputs)
