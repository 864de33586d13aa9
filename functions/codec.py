"""The tensor codec: a small fixed binary header (dtype, shape, compression) followed by the raw bytes.

Layout (little endian)::

    0   4s  magic b"FPT1"
    4   B   dtype code (see _DTYPES)
    5   B   ndim
    6   B   compression (0 none, 1 zstd, 2 lz4)
    7   B   reserved (0)
    8   Q   payload length in bytes (after the header)
    16  Q*  shape, one u64 per axis
    ..      zero padding to a multiple of 64 bytes, so the payload is cache-line aligned

Uncompressed payloads decode without a copy: the array is a read-only view of the buffer it came in
(bytes, mmap, memoryview), which therefore stays alive as long as the array does. Compression is
optional (zstandard / lz4 are imported only when used). Never pickle: the header is the whole schema.
"""

from __future__ import annotations

import mmap
import struct
from typing import Literal, TypeAlias

import numpy as np

__all__ = [
    "ALIGN",
    "advance_views",
    "Buffer",
    "Compression",
    "CodecError",
    "TensorHeader",
    "decode",
    "encode",
    "encode_parts",
    "encoded_size",
    "read_header",
]

# What the codec reads from and writes to (collections.abc.Buffer is 3.12+). Not an ndarray: before 3.12
# numpy's types do not make it a buffer, so its memory is handed over as ``array.data`` (a memoryview).
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap

MAGIC = b"FPT1"
ALIGN = 64
_FIXED = struct.Struct("<4sBBBBQ")

Compression = Literal["none", "zstd", "lz4"]
_COMPRESSION: dict[str, int] = {"none": 0, "zstd": 1, "lz4": 2}
_COMPRESSION_NAMES = {v: k for k, v in _COMPRESSION.items()}

_DTYPES: dict[str, int] = {
    "float32": 1,
    "float16": 2,
    "float64": 3,
    "int8": 4,
    "uint8": 5,
    "int16": 6,
    "uint16": 7,
    "int32": 8,
    "uint32": 9,
    "int64": 10,
    "uint64": 11,
    "bool": 12,
    "complex64": 13,
    "complex128": 14,
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


class CodecError(ValueError):
    """Bytes that are not a flatpack tensor, or a dtype the codec does not carry."""


class TensorHeader:
    __slots__ = ("compression", "dtype", "header_len", "payload_len", "shape")

    def __init__(
        self, dtype: np.dtype, shape: tuple[int, ...], compression: str, header_len: int, payload_len: int
    ) -> None:
        self.dtype = dtype
        self.shape = shape
        self.compression = compression
        self.header_len = header_len
        self.payload_len = payload_len

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def _header_len(ndim: int) -> int:
    raw = _FIXED.size + 8 * ndim
    return (raw + ALIGN - 1) // ALIGN * ALIGN


def _pack_header(dtype: np.dtype, shape: tuple[int, ...], compression: str, payload_len: int) -> bytes:
    code = _DTYPES.get(dtype.name)
    if code is None:
        raise CodecError(f"dtype {dtype} is not supported by the tensor codec; supported: {sorted(_DTYPES)}")
    if len(shape) > 255:
        raise CodecError(f"a tensor of rank {len(shape)} is over the codec's limit of 255 axes")
    head = _FIXED.pack(MAGIC, code, len(shape), _COMPRESSION[compression], 0, payload_len)
    head += struct.pack(f"<{len(shape)}Q", *shape)
    return head + b"\0" * (_header_len(len(shape)) - len(head))


def _compress(data: bytes | memoryview, compression: str) -> bytes:
    if compression == "zstd":
        try:
            import zstandard
        except ImportError as e:
            raise CodecError("zstd compression needs the zstandard package: pip install 'flatpack[codecs]'") from e
        return zstandard.ZstdCompressor(level=1).compress(data)
    if compression == "lz4":
        try:
            import lz4.frame
        except ImportError as e:
            raise CodecError("lz4 compression needs the lz4 package: pip install 'flatpack[codecs]'") from e
        return lz4.frame.compress(data)
    raise CodecError(f"unknown compression {compression!r}; use one of {sorted(_COMPRESSION)}")


def _decompress(data: memoryview, compression: str, size: int) -> bytes:
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    if compression == "lz4":
        import lz4.frame

        return lz4.frame.decompress(data)
    raise CodecError(f"unknown compression code in tensor header: {compression!r}")


def _little_endian_contiguous(array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    # not np.ascontiguousarray: it turns a 0-d array into a 1-d one
    return a if a.flags.c_contiguous else a.copy(order="C")


def encode_parts(array: np.ndarray, compression: Compression = "none") -> tuple[bytes, Buffer]:
    """Header bytes and payload buffer, for writers that can send two buffers without joining them.

    The payload is a view of ``array`` (made contiguous if it was not) when uncompressed.
    """
    if compression not in _COMPRESSION:
        raise CodecError(f"unknown compression {compression!r}; use one of {sorted(_COMPRESSION)}")
    a = _little_endian_contiguous(array)
    payload: bytes | memoryview = a.reshape(-1).view(np.uint8).data if a.size else b""
    if compression != "none":
        payload = _compress(payload, compression)
    return _pack_header(a.dtype, tuple(int(d) for d in a.shape), compression, len(memoryview(payload))), payload


def encode(array: np.ndarray, compression: Compression = "none") -> bytes:
    """One buffer: header followed by the (optionally compressed) payload."""
    head, payload = encode_parts(array, compression)
    return head + bytes(payload)


def encoded_size(array: np.ndarray) -> int:
    """Size of the uncompressed encoding, without encoding."""
    return _header_len(np.ndim(array)) + int(np.asarray(array).nbytes)


def read_header(buf: Buffer) -> TensorHeader:
    mv = memoryview(buf)
    if mv.nbytes < _FIXED.size:
        raise CodecError(f"{mv.nbytes} bytes is too short for a tensor header ({_FIXED.size} at least)")
    magic, code, ndim, comp, _, payload_len = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CodecError(f"not a flatpack tensor (magic {bytes(magic)!r}, expected {MAGIC!r})")
    dtype_name = _DTYPE_NAMES.get(code)
    if dtype_name is None:
        raise CodecError(f"unknown dtype code {code} in tensor header")
    if comp not in _COMPRESSION_NAMES:
        raise CodecError(f"unknown compression code {comp} in tensor header")
    header_len = _header_len(ndim)
    if mv.nbytes < header_len:
        raise CodecError(f"truncated tensor header: {mv.nbytes} bytes, need {header_len}")
    shape = struct.unpack_from(f"<{ndim}Q", mv, _FIXED.size)
    return TensorHeader(
        np.dtype(dtype_name), tuple(int(d) for d in shape), _COMPRESSION_NAMES[comp], header_len, payload_len
    )


def decode(buf: Buffer) -> np.ndarray:
    """The array in ``buf``; zero-copy (a read-only view of ``buf``) when uncompressed.

    Bytes after the payload are ignored, so a buffer may be larger than the tensor it holds.
    """
    h = read_header(buf)
    mv = memoryview(buf)
    end = h.header_len + h.payload_len
    if mv.nbytes < end:
        raise CodecError(f"truncated tensor: {mv.nbytes} bytes, header says {end}")
    if h.compression == "none":
        if h.payload_len != h.nbytes:
            raise CodecError(f"tensor payload is {h.payload_len} bytes, {h.dtype}{list(h.shape)} needs {h.nbytes}")
        if h.nbytes == 0:
            return np.empty(h.shape, dtype=h.dtype)
        return np.frombuffer(mv, dtype=h.dtype, count=h.nbytes // h.dtype.itemsize, offset=h.header_len).reshape(
            h.shape
        )
    raw = _decompress(mv[h.header_len : end], h.compression, h.nbytes)
    if len(raw) != h.nbytes:
        raise CodecError(f"decompressed {len(raw)} bytes, {h.dtype}{list(h.shape)} needs {h.nbytes}")
    return np.frombuffer(raw, dtype=h.dtype).reshape(h.shape)


def advance_views(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes from ``views`` in place, as a vectored write (``sendmsg``, ``writev``) that
    wrote ``n`` of them leaves the rest to send."""
    while n and views:
        if n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        else:
            views[0] = views[0][n:]
            n = 0
