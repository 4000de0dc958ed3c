"""The OTLP write-ahead log's record format and segment files (`collector/wal.py` writes
and replays them).

A record is a 17-byte header and the payload, as the receivers accepted it (the
decompressed export, protobuf or OTLP/JSON):

    [length u32][crc32 u32][seq u64][kind u8][payload: length bytes]      (little-endian)

The CRC covers seq, kind and payload, so a header torn inside its seq or a record
whose payload was half written fails it.  A segment is read up to its first record
that is short or fails its CRC: a crash mid-write leaves at most a torn tail, and
nothing after a damaged record is trusted (its length may be garbage).  Segments are
named by their first seq (`00000000000000000042.seg`), so their names sort in seq order.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HEADER = struct.Struct("<IIQB")
#: The most a record's payload may hold: what a u32 length can say.
MAX_PAYLOAD = 2**32 - 1
SEGMENT_SUFFIX = ".seg"

#: What a record holds: the signal, and the encoding its receiver took it in.
KIND_TRACES_PROTOBUF = 1
KIND_TRACES_JSON = 2
KIND_METRICS_PROTOBUF = 3
KIND_METRICS_JSON = 4
KINDS = frozenset(
    (KIND_TRACES_PROTOBUF, KIND_TRACES_JSON, KIND_METRICS_PROTOBUF, KIND_METRICS_JSON)
)


@dataclass(frozen=True, slots=True)
class WalRecord:
    seq: int
    kind: int
    payload: bytes


def record_header(seq: int, kind: int, payload: bytes) -> bytes:
    """Gives the header that goes before `payload` in a segment."""
    tail = struct.pack("<QB", seq, kind)
    crc = zlib.crc32(payload, zlib.crc32(tail))
    return HEADER.pack(len(payload), crc, seq, kind)


def encode_record(seq: int, kind: int, payload: bytes) -> bytes:
    """Gives the record as it lies in a segment (tests; the log writes header and payload
    apart, without copying the payload)."""
    return record_header(seq, kind, payload) + payload


@dataclass(slots=True)
class SegmentRead:
    """What reading one segment found: its good records, and where and why it stopped
    early (None: it ended cleanly)."""

    records: list[WalRecord]
    good_bytes: int
    damage: str | None = None


def read_segment(path: Path) -> SegmentRead:
    """Gives the records of a segment up to its first torn or corrupt one."""
    data = path.read_bytes()
    out = SegmentRead([], 0)
    pos, end = 0, len(data)
    view = memoryview(data)
    while pos < end:
        if end - pos < HEADER.size:
            out.damage = f"a torn header at byte {pos}"
            break
        length, crc, seq, kind = HEADER.unpack_from(data, pos)
        start = pos + HEADER.size
        if end - start < length:
            out.damage = f"a torn record at byte {pos} (seq {seq})"
            break
        payload = view[start : start + length]
        if zlib.crc32(payload, zlib.crc32(data[pos + 8 : start])) != crc or kind not in KINDS:
            out.damage = f"a corrupt record at byte {pos}"
            break
        out.records.append(WalRecord(seq, kind, bytes(payload)))
        pos = start + length
        out.good_bytes = pos
    return out


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def segment_paths(directory: Path) -> list[Path]:
    """Gives the log's segments in seq order."""
    return sorted(p for p in directory.glob("*" + SEGMENT_SUFFIX) if p.stem.isdigit())


def iter_records(paths: list[Path]) -> Iterator[tuple[Path, SegmentRead]]:
    for path in paths:
        yield path, read_segment(path)
