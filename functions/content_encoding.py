"""Request bodies sent with ``Content-Encoding: gzip`` or ``deflate`` (tritonclient's
``request_compression_algorithm``), decoded under the endpoint's body limit.

A small compressed body can expand a thousandfold (a decompression bomb), so the limit applies to the
decoded bytes: decoding stops, and :class:`RequestTooLarge` is raised, as soon as the output would pass
it, before it is held in memory. ``deflate`` is the zlib format (RFC 9110 §8.4.1.2; what tritonclient
sends), and raw deflate data is accepted too, as browsers and some clients send it. ``identity`` (or no
header) passes the body through; any other coding is refused with :class:`UnsupportedEncoding` (415).
Standard library only: it runs in function packages too.
"""

from __future__ import annotations

import zlib

from functions.http_errors import InvalidInput, RequestTooLarge, UnsupportedEncoding

__all__ = ["CODINGS", "decode_body"]

#: the content codings a request body may have
CODINGS = ("gzip", "deflate", "identity")

_CHUNK = 1 << 16  # compressed bytes fed to the decoder at a time
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_RAW_DEFLATE_WBITS = -zlib.MAX_WBITS


def decode_body(body: bytes, coding: str | None, limit: int) -> bytes:
    """``body`` decoded from ``coding`` (a ``Content-Encoding`` value; None: not encoded), at most
    ``limit`` bytes. Raises :class:`UnsupportedEncoding` for other codings, :class:`InvalidInput` for data
    that is not what the header says, :class:`RequestTooLarge` when the decoded body passes ``limit``."""
    codings = [c.strip().lower() for c in (coding or "").split(",") if c.strip()]
    for c in reversed(codings):  # codings apply in the order listed, so they come off in reverse
        if c == "identity":
            continue
        if c in ("gzip", "x-gzip"):
            body = _inflate(body, _GZIP_WBITS, limit, c)
        elif c == "deflate":
            body = _inflate_deflate(body, limit)
        else:
            raise UnsupportedEncoding(f"Content-Encoding {c!r} is not supported; send {', '.join(CODINGS)}")
    return body


def _inflate_deflate(body: bytes, limit: int) -> bytes:
    # a zlib stream starts with a header whose two bytes, read as a big-endian number, divide by 31
    zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and int.from_bytes(body[:2], "big") % 31 == 0
    return _inflate(body, zlib.MAX_WBITS if zlib_header else _RAW_DEFLATE_WBITS, limit, "deflate")


def _inflate(body: bytes, wbits: int, limit: int, coding: str) -> bytes:
    """Decode ``body`` (gzip: one or more members back to back), stopping past ``limit`` bytes."""
    out = bytearray()
    data = body
    while True:
        decoder = zlib.decompressobj(wbits)
        pending = data
        try:
            while pending and not decoder.eof:
                # max_length bounds what one call may produce: the bomb is never held whole
                out += decoder.decompress(pending, limit + 1 - len(out))
                if len(out) > limit:
                    raise RequestTooLarge(f"request body decodes ({coding}) to more than the {limit} byte limit")
                pending = decoder.unconsumed_tail
        except zlib.error as e:
            raise InvalidInput(f"request body is not valid {coding} data: {e}") from None
        if not decoder.eof:
            raise InvalidInput(f"request body is not valid {coding} data: it ends before the stream does")
        data = decoder.unused_data
        if not data.strip(b"\0"):  # gzip readers ignore trailing zero padding; so does this one
            return bytes(out)
        if wbits != _GZIP_WBITS:
            raise InvalidInput(f"request body has {len(data)} bytes after the end of its {coding} data")
