"""Entry point of a rendered cloud function: ``flatpack_entry.handler`` on AWS Lambda, and the HTTP
adapter the OpenFaaS template's server (``templates/openfaas/flatpack/index.py``) calls.

The deployers copy this file beside the ``functions/`` package, the vendored dependencies (``vendor/``,
Lambda only) and the bundle (``bundle/``). It depends on the standard library, numpy and the function
runtime only (no pydantic, no serving/), so a function package stays small.

Two kinds of events reach :func:`handler`:

* **HTTP API requests** (payload format 2.0, or the REST API's 1.0) on the master: the Open Inference
  Protocol v2 routes ``POST /v2/models/{model}/infer`` (JSON tensors or the binary tensor extension,
  base64 in the event), ``GET /v2/models/{model}[/ready]``, ``GET /v2/health/live|ready``. The request
  becomes an ``infer`` event run by this instance's :class:`functions.runtime.FunctionRuntime` in process,
  with the deadline Lambda's context says is left.
* **flatpack function events** (the master's boto3 invokes of its workers): run as
  :func:`functions.handlers.aws_lambda.handler` runs them (``handle_doc`` with the deadline the context
  leaves), on the same runtime the HTTP routes use, so an instance loads its parts once.

Cold start: ``FLATPACK_BUNDLE_DIR`` relative to this file is made absolute; with
``FLATPACK_BUNDLE_S3_URI=s3://bucket/prefix`` (parts too large for the package) the files this function
needs are fetched to ``/tmp`` first and checked against the manifest's sha256.

Nothing escapes: every failure becomes an HTTP error response or a structured error reply (a Lambda
runtime reports an escaped exception as ``Unhandled``; serverless-offline hangs on one).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
# The package's own copies first: vendored wheels, then the function runtime beside this file.
for _p in (_HERE, _HERE / "vendor"):
    if _p.is_dir() and str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

__all__ = ["handler", "http_event", "runtime"]

log = logging.getLogger("flatpack_entry")

HEADER_LENGTH = "inference-header-content-length"
_DATATYPES = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
    "FP32": "float32", "FP64": "float64",
}
_NAMES = {v: k for k, v in _DATATYPES.items()}
# a margin to encode and return the reply before Lambda stops the invocation
_REPLY_MARGIN_MS = 250


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --------------------------------------------------------------------------------------------------
# Cold start: where the bundle is
# --------------------------------------------------------------------------------------------------


def _bundle_from_s3(uri: str, function: str, dest: Path) -> Path:
    """Fetch plan.json, manifest.json and the files ``function`` runs from ``uri`` into ``dest``."""
    import boto3  # the Lambda runtime ships boto3

    from functions.plan import Plan

    if not uri.startswith("s3://"):
        raise ValueError(f"FLATPACK_BUNDLE_S3_URI={uri!r} is not an s3://bucket/prefix URI")
    bucket, _, prefix = uri[5:].partition("/")
    prefix = prefix.strip("/")
    s3 = boto3.client("s3", endpoint_url=os.environ.get("FLATPACK_S3_ENDPOINT_URL") or None)
    dest.mkdir(parents=True, exist_ok=True)

    def fetch(rel: str) -> Path:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".part")
        s3.download_file(bucket, f"{prefix}/{rel}" if prefix else rel, str(tmp))
        os.replace(tmp, out)
        return out

    manifest = json.loads(fetch("manifest.json").read_text())
    plan = Plan.load(fetch("plan.json"))
    wanted = {p.file for s in plan.stages for p in s.parts if p.function == function}
    if function == plan.master:
        wanted |= {s.epilogue for s in plan.stages if s.epilogue}
    digests = manifest.get("files", {})
    for rel in sorted(wanted):
        path = dest / rel
        if not (path.is_file() and _sha256(path) == digests.get(rel)):
            fetch(rel)
        if _sha256(path) != digests.get(rel):
            raise ValueError(f"{uri}/{rel} does not match the bundle manifest (sha256); re-deploy the bundle")
    return dest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _locate_bundle() -> None:
    uri = os.environ.get("FLATPACK_BUNDLE_S3_URI")
    if uri:
        # /tmp is the only writable place in a Lambda; it survives while the execution environment does
        root = Path(tempfile.gettempdir()) / "flatpack" / os.environ.get("FLATPACK_DEPLOYMENT", "bundle")
        fn = os.environ.get("FLATPACK_FUNCTION", "")
        os.environ["FLATPACK_BUNDLE_DIR"] = str(_bundle_from_s3(uri, fn, root / fn))
        return
    rel = os.environ.get("FLATPACK_BUNDLE_DIR", "bundle")
    if not Path(rel).is_absolute():
        os.environ["FLATPACK_BUNDLE_DIR"] = str(_HERE / rel)


_runtime: Any = None


def runtime() -> Any:
    """The instance's :class:`functions.runtime.FunctionRuntime`, built on first use (the cold start) and kept
    while the instance lives (a module-level instance is how Lambda and OpenFaaS keep state across calls)."""
    global _runtime
    if _runtime is None:
        _locate_bundle()
        from functions.config import FunctionConfig
        from functions.runtime import FunctionRuntime

        _runtime = FunctionRuntime(FunctionConfig.from_env())
    return _runtime


# --------------------------------------------------------------------------------------------------
# The Open Inference Protocol v2 over HTTP API events
# --------------------------------------------------------------------------------------------------


def _response(status: int, doc: Any = None, *, body: bytes | None = None,
              headers: dict[str, str] | None = None) -> dict[str, Any]:
    if body is None:
        return {"statusCode": status, "headers": {"content-type": "application/json", **(headers or {})},
                "body": json.dumps(doc, separators=(",", ":")), "isBase64Encoded": False}
    return {"statusCode": status, "headers": {"content-type": "application/octet-stream", **(headers or {})},
            "body": base64.b64encode(body).decode("ascii"), "isBase64Encoded": True}


def _error(status: int, message: str) -> dict[str, Any]:
    return _response(status, {"error": message})


def _tensor_meta(t: Any) -> dict[str, Any]:
    return {"name": t.name, "datatype": _NAMES.get(t.dtype, t.dtype), "shape": list(t.shape)}


def _decode_infer(body: bytes, header_length: str | None, plan: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request document and its input arrays, checked against the model's inputs."""
    import numpy as np

    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise _HttpError(400, f"Inference-Header-Content-Length must be an integer, got {header_length!r}") \
                from None
        if not 0 < n <= len(body):
            raise _HttpError(400, f"Inference-Header-Content-Length is {n} but the body has {len(body)} bytes")
        header, binary = body[:n], memoryview(body)[n:]
    else:
        header, binary = body, memoryview(b"")
    try:
        doc = json.loads(header)
    except (ValueError, UnicodeDecodeError) as e:
        raise _HttpError(400, f"request is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise _HttpError(400, "an infer request is a JSON object with a non-empty 'inputs' list")
    specs = {t.name: t for t in plan.model.inputs}
    arrays: dict[str, Any] = {}
    offset = 0
    for inp in doc["inputs"]:
        if not isinstance(inp, dict) or not isinstance(inp.get("name"), str):
            raise _HttpError(400, "every input needs a 'name'")
        name = inp["name"]
        spec = specs.get(name)
        if spec is None:
            raise _HttpError(400, f"unknown input {name!r}; the model takes {sorted(specs)}")
        dtype = _DATATYPES.get(str(inp.get("datatype")))
        if dtype is None:
            raise _HttpError(400, f"input {name!r}: unsupported datatype {inp.get('datatype')!r}; "
                                  f"use one of {', '.join(_DATATYPES)}")
        shape = inp.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise _HttpError(400, f"input {name!r}: shape must be a list of non-negative integers")
        count = int(np.prod(shape, dtype=np.int64))
        size = (inp.get("parameters") or {}).get("binary_data_size")
        try:
            if size is not None:
                size = int(size)
                if size != count * np.dtype(dtype).itemsize or offset + size > len(binary):
                    raise _HttpError(400, f"input {name!r}: binary_data_size {size} does not match shape {shape} "
                                          f"or the binary data left ({len(binary) - offset} bytes)")
                arr = np.frombuffer(binary[offset:offset + size], dtype=dtype).reshape(shape)
                offset += size
            else:
                arr = np.asarray(inp.get("data"), dtype=dtype).reshape(shape)
        except (TypeError, ValueError) as e:
            raise _HttpError(400, f"input {name!r}: data does not fill shape {shape} as {inp.get('datatype')}: "
                                  f"{e}") from None
        if tuple(arr.shape) != tuple(spec.shape) or arr.dtype != np.dtype(spec.dtype):
            raise _HttpError(400, f"input {name!r} must be {_NAMES.get(spec.dtype, spec.dtype)}{list(spec.shape)}, "
                                  f"got {inp.get('datatype')}{shape}")
        if name in arrays:
            raise _HttpError(400, f"input {name!r} is given twice")
        arrays[name] = arr
    if offset != len(binary):
        raise _HttpError(400, f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    missing = sorted(set(specs) - set(arrays))
    if missing:
        raise _HttpError(400, f"missing inputs {missing}")
    return doc, arrays


_STATUS = {"BadRequest": 400, "PayloadTooLarge": 413, "Timeout": 504, "Throttled": 429, "OutOfMemory": 507}


def _infer(rt: Any, model: str, body: bytes, header_length: str | None, context: Any) -> dict[str, Any]:
    import numpy as np

    from functions.codec import encode
    from functions.event import Event, TensorEntry, now_ms

    plan = rt.plan
    doc, arrays = _decode_infer(body, header_length, plan)
    deadline = now_ms() + int(rt.config.invoke_timeout_ms)
    if context is not None and hasattr(context, "get_remaining_time_in_millis"):
        deadline = min(deadline, now_ms() + int(context.get_remaining_time_in_millis()) - _REPLY_MARGIN_MS)
    rid = f"h{uuid.uuid4().hex[:16]}"
    event = Event("infer", rid, rt.config.deployment, deadline,
                  tuple(TensorEntry(n, data=encode(np.ascontiguousarray(a))) for n, a in arrays.items()))
    reply = rt.handle_event(event, "json")
    if reply.error is not None:
        err = dict(reply.error)
        return _error(_STATUS.get(str(err.get("type")), 502), f"{err.get('type')}: {err.get('message')}")
    outputs = rt.channel("json").receive(reply.outputs, delete=True)
    params = doc.get("parameters") or {}
    binary_default = bool(params.get("binary_data_output", False))
    requested = doc.get("outputs")
    wanted: dict[str, bool] = {}
    if isinstance(requested, list) and requested:
        for o in requested:
            name = o.get("name") if isinstance(o, dict) else None
            if name not in outputs:
                return _error(400, f"unknown output {name!r}; the model has {sorted(outputs)}")
            wanted[name] = bool((o.get("parameters") or {}).get("binary_data", binary_default))
    else:
        wanted = {t.name: binary_default for t in plan.model.outputs}
    entries, blobs = [], []
    for name, binary in wanted.items():
        arr = np.ascontiguousarray(outputs[name])
        entry: dict[str, Any] = {"name": name, "datatype": _NAMES.get(arr.dtype.name, arr.dtype.name),
                                 "shape": list(arr.shape)}
        if binary:
            raw = arr.tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = arr.reshape(-1).tolist()
        entries.append(entry)
    out: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": entries}
    if doc.get("id") is not None:
        out["id"] = doc["id"]
    if not blobs:
        return _response(200, out)
    header = json.dumps(out, separators=(",", ":")).encode()
    return _response(200, body=header + b"".join(blobs), headers={HEADER_LENGTH: str(len(header))})


def _http(event: dict[str, Any], context: Any) -> dict[str, Any]:
    ctx = event.get("requestContext") or {}
    method = str((ctx.get("http") or {}).get("method") or event.get("httpMethod") or "GET").upper()
    path = str(event.get("rawPath") or (ctx.get("http") or {}).get("path") or event.get("path") or "/")
    stage = ctx.get("stage")
    if stage and stage != "$default" and path.startswith(f"/{stage}/"):
        path = path[len(stage) + 1:]
    parts = [p for p in path.split("/") if p]
    if parts == ["v2", "health", "live"] and method == "GET":
        return _response(200, {"live": True})
    token = os.environ.get("FLATPACK_API_TOKEN")
    if token:
        got = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}.get("authorization", "")
        if not (got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), token.encode())):
            return _response(401, {"error": "missing or wrong bearer token"}, headers={"www-authenticate": "Bearer"})
    rt = runtime()
    model = os.environ.get("FLATPACK_MODEL_NAME") or rt.plan.model.name
    if parts == ["v2", "health", "ready"] and method == "GET":
        return _response(200, {"ready": True})
    if len(parts) < 3 or parts[:2] != ["v2", "models"]:
        return _error(404, f"no route {method} {path}; the model is at /v2/models/{model}/infer")
    if parts[2] != model:
        return _error(404, f"no model {parts[2]!r}; this endpoint serves {model!r}")
    rest = parts[3:]
    if rest == [] and method == "GET":
        m = rt.plan.model
        return _response(200, {"name": model, "versions": ["1"], "platform": "onnxruntime_onnx",
                               "inputs": [_tensor_meta(t) for t in m.inputs],
                               "outputs": [_tensor_meta(t) for t in m.outputs]})
    if rest == ["ready"] and method == "GET":
        return _response(200, {"name": model, "ready": True})
    if rest == ["infer"] and method == "POST":
        raw = event.get("body") or ""
        body = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode("utf-8")
        headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
        return _infer(rt, model, body, headers.get(HEADER_LENGTH), context)
    return _error(405 if rest in ([], ["ready"], ["infer"]) else 404, f"no route {method} {path}")


def http_event(method: str, path: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """An HTTP request as the HTTP API event (payload 2.0) :func:`handler` takes (the OpenFaaS server's use)."""
    return {"version": "2.0", "rawPath": path, "requestContext": {"http": {"method": method, "path": path}},
            "headers": headers, "body": base64.b64encode(body).decode("ascii"), "isBase64Encoded": True}


def _is_http(event: Any) -> bool:
    return isinstance(event, dict) and "requestContext" in event and ("rawPath" in event or "httpMethod" in event)


def handler(event: Any, context: Any) -> dict[str, Any]:
    """The Lambda handler: OIP v2 over HTTP API events, flatpack function events otherwise."""
    t0 = time.perf_counter()
    if _is_http(event):
        try:
            return _http(event, context)
        except _HttpError as e:
            return _error(e.status, e.message)
        except Exception as e:  # noqa: BLE001 - an HTTP client gets a 500 with the reason, never a hang
            log.exception("flatpack: HTTP request failed")
            return _error(500, f"{type(e).__name__}: {e}")
    try:
        rt = runtime()
        deadline_ms = None
        if context is not None and hasattr(context, "get_remaining_time_in_millis"):
            deadline_ms = int(time.time() * 1000) + int(context.get_remaining_time_in_millis()) - _REPLY_MARGIN_MS
        return rt.handle_doc(event, deadline_ms=deadline_ms)
    except Exception as e:  # noqa: BLE001 - a structured error reply is what the master's invoker reads
        log.exception("flatpack: function event failed")
        return {"error": {"type": "InitError" if _runtime is None else "PartError",
                          "message": f"{type(e).__name__}: {e}", "function": os.environ.get("FLATPACK_FUNCTION")},
                "timings": {"total_ms": 1e3 * (time.perf_counter() - t0)}, "peak_rss_mb": 0.0}
