"""The function event and its reply, and their two wire forms.

An event asks a function to run the whole plan (``kind="infer"``, the master) or one part of one stage
(``kind="part"``, a worker)::

    {kind, request_id, deployment, stage, part, attempt, deadline_ms, inputs: [{name, ref | inline}]}

and the reply is ``{outputs: [{name, ref | inline}], timings, peak_rss_mb[, trace]}`` or ``{error: {type, message}}``
(``trace``: the master's spans of the request, :mod:`functions.trace`'s rows).
``deadline_ms`` is Unix time in milliseconds by which the caller needs the reply.

Two wire forms carry the same document:

* **JSON** (what AWS Lambda's runtime hands a handler): inline tensors are base64 of their codec bytes.
* **binary** (local platform, OpenFaaS): ``b"FPEV"`` + counts + the JSON document + the inline tensors as
  raw, 64-byte aligned blobs, so they decode without a copy and without base64's 4/3 inflation.

Decoding detects the form from the first bytes. Nothing here ever unpickles.

The JSON document goes through orjson where it is installed (a master encodes an event and decodes a reply
per part of every stage, and the standard library spent a tenth of a master's CPU on it), the standard
library where not: a document orjson refuses is parsed again by the standard library, so what is accepted
and how a refusal reads do not depend on it. orjson writes a NaN or an infinity as ``null`` (the standard
library writes ``NaN``, which is not JSON); a timing that reads back ``null`` is left out.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from functions.codec import ALIGN, Buffer
from functions.errors import BadRequest, FunctionError
from functions.plan import Region
from functions.trace import Span, spans_from_rows, spans_to_rows

try:
    import orjson as _orjson
except ImportError:  # a function package without it: the standard library
    _orjson = None  # type: ignore[assignment]  # the module or nothing: checked before every use

__all__ = [
    "Event",
    "EventKind",
    "Reply",
    "TensorEntry",
    "Wire",
    "decode_message",
    "encode_message",
    "now_ms",
]

EventKind = Literal["infer", "part"]
_EVENT_KINDS: tuple[EventKind, ...] = ("infer", "part")
Wire = Literal["binary", "json"]

_MAGIC = b"FPEV"
_HEAD = struct.Struct("<4sIQ")  # magic, number of blobs, JSON length


def now_ms() -> int:
    import time

    return int(time.time() * 1000)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor in an event or reply: either ``data`` (codec bytes, inline) or ``ref`` (in a transport).

    ``region`` (refs only) asks the reader to take that box of the stored tensor, so several parts can
    read their regions of one stored tensor (zero-copy on shared memory). ``dtype`` and ``shape`` describe
    the stored tensor of a ref, so its holder knows it without fetching it.
    """

    name: str
    ref: str | None = None
    data: Buffer | None = field(default=None, repr=False)
    region: Region | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.ref is None) == (self.data is None):
            raise BadRequest(f"tensor entry {self.name!r} needs exactly one of ref and inline data")

    @property
    def nbytes(self) -> int:
        """Bytes this entry adds to a message (inline data only)."""
        return 0 if self.data is None else memoryview(self.data).nbytes

    def _to_doc(self, blobs: list[Buffer]) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.ref is not None:
            d["ref"] = self.ref
            if self.dtype is not None:
                d["dtype"] = self.dtype
            if self.shape is not None:
                d["shape"] = list(self.shape)
        else:
            assert self.data is not None
            d["blob"] = len(blobs)
            blobs.append(self.data)
        if self.region is not None:
            d["region"] = [list(r) for r in self.region]
        return d

    @classmethod
    def _from_doc(cls, d: Mapping[str, Any], blobs: Sequence[Buffer]) -> TensorEntry:
        try:
            region = d.get("region")
            shape = d.get("shape")
            data: Buffer | None = None
            if "blob" in d:
                data = blobs[int(d["blob"])]
            elif "inline" in d:
                data = base64.b64decode(d["inline"], validate=True)
            return cls(
                name=str(d["name"]),
                ref=None if d.get("ref") is None else str(d["ref"]),
                data=data,
                region=None if region is None else tuple((int(a), int(b)) for a, b in region),
                dtype=None if d.get("dtype") is None else str(d["dtype"]),
                shape=None if shape is None else tuple(int(x) for x in shape),
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BadRequest(f"malformed tensor entry {dict(d)!r:.200}: {e}") from e


class _Message:
    """The wire forms of a document type (:class:`Event`, :class:`Reply`): ``to_doc`` writes its JSON
    document, putting inline tensors in ``blobs``; ``from_doc`` reads one back."""

    def to_doc(self, blobs: list[Buffer]) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_doc(cls, d: Mapping[str, Any], blobs: Sequence[Buffer] = ()) -> Self:
        raise NotImplementedError

    def encode(self, wire: Wire = "binary") -> bytes:
        blobs: list[Buffer] = []
        return encode_message(self.to_doc(blobs), blobs, wire)

    def to_json_doc(self) -> dict[str, Any]:
        """The JSON-form document (inline tensors as base64): a Lambda event, or what a Lambda handler returns."""
        blobs: list[Buffer] = []
        return _inline_blobs(self.to_doc(blobs), blobs)

    @classmethod
    def decode(cls, data: Buffer) -> Self:
        doc, blobs = decode_message(data)
        return cls.from_doc(doc, blobs)


@dataclass(frozen=True)
class Event(_Message):
    kind: EventKind
    request_id: str
    deployment: str
    deadline_ms: int
    inputs: tuple[TensorEntry, ...] = ()
    stage: int | None = None
    part: int | None = None
    attempt: int = 0

    def to_doc(self, blobs: list[Buffer]) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind,
            "request_id": self.request_id,
            "deployment": self.deployment,
            "deadline_ms": self.deadline_ms,
            "inputs": [e._to_doc(blobs) for e in self.inputs],
        }
        if self.stage is not None:
            d["stage"] = self.stage
            d["part"] = self.part
            d["attempt"] = self.attempt
        return d

    @classmethod
    def from_doc(cls, d: Mapping[str, Any], blobs: Sequence[Buffer] = ()) -> Event:
        if not isinstance(d, Mapping):
            raise BadRequest(f"an event is a JSON object, got {type(d).__name__}")
        try:
            kind = str(d.get("kind", "infer"))
            if kind not in _EVENT_KINDS:
                raise BadRequest(f"unknown event kind {kind!r}; expected 'infer' or 'part'")
            ev = cls(
                kind=kind,
                request_id=str(d["request_id"]),
                deployment=str(d["deployment"]),
                deadline_ms=int(d["deadline_ms"]),
                inputs=tuple(TensorEntry._from_doc(e, blobs) for e in d.get("inputs", ())),
                stage=None if d.get("stage") is None else int(d["stage"]),
                part=None if d.get("part") is None else int(d["part"]),
                attempt=int(d.get("attempt", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, BadRequest):
                raise
            raise BadRequest(f"malformed event: missing or bad field {e}") from e
        if ev.kind == "part" and (ev.stage is None or ev.part is None):
            raise BadRequest("a part event needs 'stage' and 'part'")
        return ev


@dataclass(frozen=True)
class Reply(_Message):
    outputs: tuple[TensorEntry, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    error: Mapping[str, Any] | None = None
    trace: tuple[Span, ...] = ()

    @classmethod
    def failure(cls, err: FunctionError, *, timings: Mapping[str, float] | None = None) -> Reply:
        return cls(error=err.to_json(), timings=dict(timings or {}))

    def to_doc(self, blobs: list[Buffer]) -> dict[str, Any]:
        if self.error is not None:
            return {"error": dict(self.error), "timings": dict(self.timings), "peak_rss_mb": self.peak_rss_mb}
        doc: dict[str, Any] = {
            "outputs": [e._to_doc(blobs) for e in self.outputs],
            "timings": {k: round(float(v), 4) for k, v in self.timings.items()},
            "peak_rss_mb": round(float(self.peak_rss_mb), 2),
        }
        if self.trace:
            doc["trace"] = spans_to_rows(self.trace)
        return doc

    @classmethod
    def from_doc(cls, d: Mapping[str, Any], blobs: Sequence[Buffer] = ()) -> Reply:
        if not isinstance(d, Mapping):
            raise BadRequest(f"a reply is a JSON object, got {type(d).__name__}")
        err = d.get("error")
        if err is not None and not isinstance(err, Mapping):
            err = {"type": "FunctionError", "message": str(err)}
        try:
            trace = spans_from_rows(d.get("trace") or ())
        except ValueError as e:
            raise BadRequest(f"malformed reply: {e}") from e
        return cls(
            outputs=tuple(TensorEntry._from_doc(e, blobs) for e in d.get("outputs", ())),
            timings={str(k): float(v) for k, v in (d.get("timings") or {}).items() if v is not None},
            peak_rss_mb=float(d.get("peak_rss_mb") or 0.0),
            error=err,
            trace=trace,
        )


def _pad(n: int) -> int:
    return (-n) % ALIGN


def _dumps(doc: Any) -> bytes:
    if _orjson is not None:
        try:
            return _orjson.dumps(doc)
        except TypeError:
            pass  # what orjson does not write (an integer past 64 bits, a float subclass): the standard library
    return json.dumps(doc, separators=(",", ":")).encode()


def _loads(data: bytes) -> Any:
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # the standard library decides, and says why in its own words
    return json.loads(data)


def encode_message(doc: dict[str, Any], blobs: Sequence[Buffer], wire: Wire = "binary") -> bytes:
    """One message: ``doc`` with its ``{"blob": i}`` entries carried as blobs (binary) or base64 (JSON)."""
    if wire == "json":
        if blobs:
            doc = _inline_blobs(doc, blobs)
        return _dumps(doc)
    if wire != "binary":
        raise ValueError(f"unknown wire form {wire!r}; use 'binary' or 'json'")
    js = _dumps(doc)
    sizes = [memoryview(b).nbytes for b in blobs]
    chunks: list[Buffer] = [_HEAD.pack(_MAGIC, len(blobs), len(js)), js]
    offset = _HEAD.size + len(js)
    chunks.append(b"\0" * _pad(offset))
    offset += _pad(offset)
    table = struct.pack(f"<{len(sizes)}Q", *sizes)
    chunks += [table, b"\0" * _pad(len(table))]
    for b, n in zip(blobs, sizes, strict=True):
        chunks += [memoryview(b).cast("B") if not isinstance(b, bytes) else b, b"\0" * _pad(n)]
    return b"".join(chunks)


def decode_message(data: Buffer) -> tuple[dict[str, Any], list[memoryview]]:
    """The document and blobs (views into ``data``, no copy) of a message in either wire form."""
    mv = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    if mv.nbytes >= _HEAD.size and bytes(mv[:4]) == _MAGIC:
        _, nblobs, js_len = _HEAD.unpack_from(mv, 0)
        off = _HEAD.size
        try:
            doc = _loads(bytes(mv[off : off + js_len]))
        except ValueError as e:
            raise BadRequest(f"binary message with a malformed JSON document: {e}") from e
        off += js_len
        off += _pad(off)
        sizes = struct.unpack_from(f"<{nblobs}Q", mv, off)
        off += 8 * nblobs
        off += _pad(8 * nblobs)
        blobs: list[memoryview] = []
        for n in sizes:
            if off + n > mv.nbytes:
                raise BadRequest(f"truncated binary message: blob of {n} bytes at {off}, message is {mv.nbytes}")
            blobs.append(mv[off : off + n])
            off += n + _pad(n)
        return doc, blobs
    try:
        doc = _loads(bytes(mv))
    except ValueError as e:
        raise BadRequest(f"message is neither flatpack binary nor JSON: {e}") from e
    return doc, []


def _inline_blobs(doc: Any, blobs: Sequence[Buffer]) -> Any:
    if isinstance(doc, dict):
        if "blob" in doc and "name" in doc:
            out = {k: v for k, v in doc.items() if k != "blob"}
            out["inline"] = base64.b64encode(memoryview(blobs[doc["blob"]]).cast("B")).decode("ascii")
            return out
        return {k: _inline_blobs(v, blobs) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_inline_blobs(v, blobs) for v in doc]
    return doc
