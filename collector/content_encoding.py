"""Request bodies decompressed within a bound: the OTLP/HTTP `Content-Encoding`s.

`gzip` (and its old name `x-gzip`), `deflate` and `zstd` are taken: gzip is the one
OTLP requires, the OpenTelemetry SDKs also offer deflate, and the OpenTelemetry
Collector offers zstd as its alternative.  Every one is decompressed incrementally
up to `limit` bytes of output, so a small body that would expand past the bound (a
"bomb") costs at most about the bound, and is refused with 413 like a body that is
too big on the wire.  snappy and lz4 (the Collector's other choices) and anything
else are refused with 415, naming what is taken.
"""

from __future__ import annotations

import zlib

import zstandard

#: The codings taken, as a 415 names them.
ACCEPTED = "gzip, deflate, zstd or none (identity)"


class BodyError(Exception):
    """The request body cannot be read; `status` is the HTTP answer (400, 413, 415)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def check_encoding(header: str) -> str:
    """Gives the coding a `Content-Encoding` header names ("" for none), or BodyError
    415 for one that is not taken."""
    coding = header.strip().lower()
    if coding in ("", "identity"):
        return ""
    if coding == "x-gzip":  # RFC 9110: a recipient should take it as gzip
        return "gzip"
    if coding in _DECOMPRESS:
        return coding
    raise BodyError(
        415, f"unsupported Content-Encoding {coding!r}: the OTLP/HTTP receiver takes {ACCEPTED}"
    )


def decompress(body: bytes, coding: str, limit: int) -> bytes:
    """Gives `body` decoded from `coding` (a `check_encoding` result), at most `limit`
    bytes of it; BodyError 413 past that, 400 for a body that is not in that coding."""
    if not coding:
        return body
    return _DECOMPRESS[coding](body, limit)


def _too_big(limit: int) -> BodyError:
    return BodyError(413, f"decompressed body exceeds {limit} bytes")


def _gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body may hold several members (RFC 1952; the OTel Collector's Go
    reader takes them all): each is read, so none is silently dropped, and
    bytes after the last one that are not a member are an error."""
    out = bytearray()
    rest = body
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            # max_length >= 1 here: 0 would mean "no bound"
            out += d.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            what = "data after the gzip stream" if out else "gzip body"
            raise BodyError(400, f"invalid {what}: {exc}") from exc
        if len(out) > limit or d.unconsumed_tail:
            raise _too_big(limit)
        if not d.eof:
            raise BodyError(400, "truncated gzip body")
        rest = d.unused_data
        if not rest:
            return bytes(out)


def _looks_zlib(body: bytes) -> bool:
    """Whether `body` starts with a zlib header (RFC 1950: deflate, a window of at most
    32 KiB, and a check that makes the two bytes a multiple of 31)."""
    return (
        len(body) >= 2
        and body[0] & 0x0F == 8
        and body[0] >> 4 <= 7
        and ((body[0] << 8 | body[1]) % 31 == 0)
    )


def _inflate(body: bytes, limit: int) -> bytes:
    """HTTP's `deflate` is zlib-wrapped (RFC 9110 8.4.1.2), but some clients send the
    raw deflate stream: a body without a zlib header, or one that fails as zlib, is
    read as raw deflate."""
    tries = (zlib.MAX_WBITS, -zlib.MAX_WBITS) if _looks_zlib(body) else (-zlib.MAX_WBITS,)
    for n, wbits in enumerate(tries, 1):
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error as exc:
            if n < len(tries):
                continue
            raise BodyError(400, f"invalid deflate body: {exc}") from exc
        if len(out) > limit or d.unconsumed_tail:
            raise _too_big(limit)
        if not d.eof:
            raise BodyError(400, "truncated deflate body")
        if d.unused_data:
            raise BodyError(400, "data after the deflate stream")
        return out
    raise AssertionError("unreachable")  # the last try returns or raises


#: The most output one byte of zstd input can make: a 4-byte RLE block (3 bytes of
#: header, 1 of data) stands for up to 128 KiB.
_ZSTD_MAX_RATIO = 128 * 1024 // 4


def _unzstd(body: bytes, limit: int) -> bytes:
    """The zstd frames of `body`, one after the other (the Collector's Go reader takes
    several).  python-zstandard's `decompressobj` has no output bound, so the input is
    fed in slices that cannot expand past a quarter of what is left of the bound (a
    bomb then costs at most 1.25 x `limit`); it also allocates the window a frame
    declares, so a window beyond what `limit` bytes need (at least 8 MiB) is refused."""
    if not body:
        raise BodyError(400, "truncated zstd body")
    try:
        declared = zstandard.frame_content_size(body)  # -1: the frame does not say
    except zstandard.ZstdError:
        declared = -1  # not a frame header: decoding says what is wrong
    if declared > limit:  # the first frame says its size: refuse before decoding it
        raise _too_big(limit)
    # zstd's levels up to 19 use windows of at most 8 MiB
    window = 1 << min(max(limit - 1, 1 << 23).bit_length(), 31)
    dctx = zstandard.ZstdDecompressor(max_window_size=window)
    out = bytearray()
    view = memoryview(body)
    pos = 0
    while pos < len(body):
        frame = dctx.decompressobj()
        while not frame.eof:
            if pos >= len(body):
                raise BodyError(400, "truncated zstd body")
            size = max(64, (limit + 1 - len(out)) // (4 * _ZSTD_MAX_RATIO))
            piece = view[pos : pos + size]
            try:
                out += frame.decompress(piece)
            except zstandard.ZstdError as exc:
                raise BodyError(400, f"invalid zstd body: {exc}") from exc
            pos += len(piece)
            if len(out) > limit:
                raise _too_big(limit)
        # what the last slice held past the frame's end starts the next frame
        pos -= len(frame.unused_data)
    return bytes(out)


_DECOMPRESS = {"gzip": _gunzip, "deflate": _inflate, "zstd": _unzstd}
