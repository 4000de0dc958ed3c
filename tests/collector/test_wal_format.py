"""The write-ahead log's records and segments: what a crash mid-write leaves is ignored,
what was synced is read back, in seq order, and segments go once the store needs none."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from tt_testkit import unwritable

from tokentrace.collector.wal import WalError, WriteAheadLog
from tokentrace.collector.wal_format import (
    HEADER,
    KIND_METRICS_PROTOBUF,
    KIND_TRACES_JSON,
    KIND_TRACES_PROTOBUF,
    encode_record,
    read_segment,
    segment_paths,
)


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000007.seg"
    path.write_bytes(
        encode_record(7, KIND_TRACES_PROTOBUF, b"\x0a\x01x")
        + encode_record(8, KIND_TRACES_JSON, b"{}")
    )
    read = read_segment(path)
    assert read.damage is None
    assert [(r.seq, r.kind, r.payload) for r in read.records] == [
        (7, KIND_TRACES_PROTOBUF, b"\x0a\x01x"),
        (8, KIND_TRACES_JSON, b"{}"),
    ]


@pytest.mark.parametrize("cut", [1, HEADER.size - 1, HEADER.size, HEADER.size + 3])
def test_a_torn_tail_is_ignored_and_the_records_before_it_kept(tmp_path: Path, cut: int) -> None:
    good = encode_record(1, KIND_TRACES_PROTOBUF, b"first")
    torn = encode_record(2, KIND_TRACES_PROTOBUF, b"second export")[:cut]
    path = tmp_path / "00000000000000000001.seg"
    path.write_bytes(good + torn)
    read = read_segment(path)
    assert [r.payload for r in read.records] == [b"first"]
    assert read.damage is not None and "torn" in read.damage


def test_nothing_after_a_corrupt_record_is_trusted(tmp_path: Path) -> None:
    bad = bytearray(encode_record(2, KIND_TRACES_PROTOBUF, b"flipped"))
    bad[-1] ^= 0xFF
    path = tmp_path / "00000000000000000001.seg"
    path.write_bytes(
        encode_record(1, KIND_TRACES_PROTOBUF, b"ok") + bytes(bad)
        + encode_record(3, KIND_TRACES_PROTOBUF, b"after")
    )  # fmt: skip
    read = read_segment(path)
    assert [r.seq for r in read.records] == [1]
    assert read.damage is not None and "corrupt" in read.damage


def test_appends_from_many_threads_are_synced_and_replayed_in_seq_order(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    seqs: list[int] = []
    lock = threading.Lock()

    def export(i: int) -> None:
        with lock:  # as the pipeline's lock does: seqs follow the buffer's order
            seq, durable = wal.append(KIND_TRACES_PROTOBUF, f"export {i}".encode())
            seqs.append(seq)
        durable.wait(10)

    threads = [threading.Thread(target=export, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wal.close()
    assert wal.appends == 200
    again = WriteAheadLog(tmp_path / "wal")
    try:
        records = list(again.records_from(None))
        assert [r.seq for r in records] == sorted(seqs) == list(range(1, 201))
        assert {r.payload for r in records} == {f"export {i}".encode() for i in range(200)}
        assert [r.seq for r in again.records_from(150)] == list(range(150, 201))
        assert again.next_seq == 201  # a restart never reuses a seq
    finally:
        again.close()


def test_a_restart_writes_a_new_segment_never_after_a_torn_tail(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(KIND_TRACES_PROTOBUF, b"acknowledged")[1].wait(10)
    wal.close()
    [segment] = segment_paths(tmp_path / "wal")
    with segment.open("ab") as f:  # a crash in the middle of the next record
        f.write(encode_record(2, KIND_TRACES_PROTOBUF, b"never acknowledged")[:10])
    again = WriteAheadLog(tmp_path / "wal")
    again.append(KIND_METRICS_PROTOBUF, b"after the restart")[1].wait(10)
    again.close()
    third = WriteAheadLog(tmp_path / "wal")
    try:
        got = [(r.seq, r.payload) for r in third.records_from(None)]
        assert got == [(1, b"acknowledged"), (2, b"after the restart")]
    finally:
        third.close()


def test_segments_below_the_checkpoint_are_deleted(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal", segment_bytes=64)
    for _ in range(6):  # each record fills a segment
        wal.append(KIND_TRACES_PROTOBUF, bytes(80))[1].wait(10)
    assert wal.segments == 6
    assert wal.release(4) == 3  # seqs 1, 2, 3: not needed once 4 is the checkpoint
    assert wal.segments == 3
    assert len(segment_paths(tmp_path / "wal")) == 3
    wal.close()


def test_a_checkpoint_beyond_the_log_sets_the_next_seq(tmp_path: Path) -> None:
    # every segment deleted, the store's checkpoint at 500: new records must lie at or
    # past it, or a restart would skip them
    wal = WriteAheadLog(tmp_path / "wal", checkpoint=500)
    try:
        assert wal.append(KIND_TRACES_PROTOBUF, b"x")[0] == 500
    finally:
        wal.close()


def test_an_unwritable_log_fails_the_group_with_the_reason(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    try:
        wal.append(KIND_TRACES_PROTOBUF, b"before")[1].wait(10)
        wal.segment_bytes = 1  # the next group opens a new segment ...
        with unwritable(tmp_path / "wal"):  # ... in a directory it cannot write
            _, durable = wal.append(KIND_TRACES_PROTOBUF, b"x")
            with pytest.raises(WalError, match="cannot be written"):
                durable.wait(10)
            assert wal.error is not None
        wal.append(KIND_TRACES_PROTOBUF, b"after")[1].wait(10)  # it writes again
        assert wal.error is None
    finally:
        wal.close()
